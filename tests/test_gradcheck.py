"""The gradient check (workflow_scripts/rank/gradcheck.py): every training trial's step
must train the whole model, as eager PyTorch does. Real torch in the real environments:
the check's arithmetic on real gradients, IPEX's broken compile on BERT-Tiny (its
quick-preset run, tests.runs.QuickStudy) and the minimal reproducer that says it is
IPEX's, a user's model whose forward detaches a block, and the optimizer knob (AdamW,
foreach, fused; ipex.optimize gets it)."""

from __future__ import annotations

import json
import math
import shutil
import subprocess

import pytest

from tests.conftest import env_python
from tests.trials import TWO_CPUS, assert_ok, run

pytestmark = [pytest.mark.slow, pytest.mark.torch]


def last_json(out: str) -> dict:
    return json.loads(out.strip().splitlines()[-1])


COMPARE = """
import json, torch
from workflow_scripts.rank import gradcheck as g
torch.manual_seed(0)
truth = {n: torch.randn(64, dtype=torch.float64) for n in ("a", "b", "c")}
truth["key_bias"] = torch.full((8,), 1e-13, dtype=torch.float64)  # a gradient of noise
def noisy(scale):
    return {n: (t + scale * t.norm() / 8 * torch.randn(t.shape, dtype=t.dtype)).float()
            for n, t in truth.items()}
out = {}
own = noisy(0.01)                       # eager at the run's precision: ~1 % off
for name, run in {
    "same_as_eager": noisy(0.01),
    "twice_eager": noisy(0.02),
    "lost_b": {**noisy(0.01), "b": None},
    "zero_b": {**noisy(0.01), "b": torch.zeros(64)},
    "wrong_c": {**noisy(0.01), "c": -truth["c"].float()},
    "noise_zero": {**noisy(0.01), "key_bias": torch.zeros(8)},
    "nan_a": {**noisy(0.01), "a": torch.full((64,), float("nan"))},
}.items():
    cmp = g.compare(run, 1.0, (1.0, truth), (1.0, own), "fp32")
    got = g.summary(run)
    out[name] = {"problem": g.problem(got, cmp, "fp32"),
                 "over": [o["parameter"] for o in cmp["over_limit"]],
                 "negligible": cmp["negligible"], "missing": cmp["missing"]}
# the run IS plain eager at its precision: its error is recorded, only its loss judged
plain = g.compare(noisy(0.5), 1.0, (1.0, truth), None, "bf16")
out["plain"] = {"problem": g.problem(g.summary(noisy(0.5)), plain, "bf16"),
                "max": plain["max_rel_error"]}
# a small tensor's error is noisier: 8x eager's own for 500 values or fewer, else 3x
big = {"a": torch.randn(2000, dtype=torch.float64)}
def off(t, scale, seed):
    g = torch.Generator().manual_seed(seed)
    e = torch.randn(t.shape, dtype=t.dtype, generator=g)
    return (t + scale * t.norm() / e.norm() * e).float()
cases = {"five_times_eager_small": {"a": truth["a"]}, "five_times_eager_large": big}
for name, ref in cases.items():
    run = {"a": off(ref["a"], 0.05, 1)}
    cmp = g.compare(run, 1.0, (1.0, ref), (1.0, {"a": off(ref["a"], 0.01, 2)}), "fp32")
    out[name] = {"problem": g.problem(g.summary(run), cmp, "fp32"),
                 "over": [o["parameter"] for o in cmp["over_limit"]]}
lossy = g.compare(noisy(0.01), 1.2, (1.0, truth), (1.0, own), "fp32")
out["loss"] = g.problem(g.summary(noisy(0.01)), lossy, "fp32")
print(json.dumps(out))
"""


def test_the_check_judges_each_parameter_against_eagers_own_error(upstream_env):
    got = last_json(env_python(upstream_env, COMPARE))
    assert got["same_as_eager"]["problem"] is None
    assert got["twice_eager"]["problem"] is None  # within 3x eager's own error
    assert got["five_times_eager_small"]["problem"] is None  # 64 values: 8x
    assert got["five_times_eager_large"]["over"] == ["a"]  # 2000 values: 3x
    assert got["same_as_eager"]["negligible"] == ["key_bias"]
    assert got["lost_b"]["problem"] == (
        "the step trained 3 of 4 parameter tensors (1 got no gradient: b)"
    )
    assert got["zero_b"]["problem"].startswith(
        "the step trained 3 of 4 parameter tensors (1 got an all-zero"
    )
    assert got["wrong_c"]["over"] == ["c"]
    assert (
        "further from fp64 eager's than 3x eager fp32's own error allows (8x for a tensor "
        "of 500 values or fewer)" in got["wrong_c"]["problem"]
    )
    assert "c (2 > " in got["wrong_c"]["problem"]
    # a gradient that is noise in fp64 may come out as zero; a NaN never passes
    assert got["noise_zero"]["problem"] is None
    assert "1 got a non-finite gradient: a" in got["nan_a"]["problem"]
    assert got["plain"]["problem"] is None and got["plain"]["max"] > 0.1
    assert got["loss"].startswith("the first step's loss 1.2 differs from fp64 eager's 1")


# A bare Linear + LayerNorm, compiled with backend="aot_eager" (no Inductor, no IPEX
# backend): only whether IPEX is imported differs between the two runs.
LAYERNORM_REPRO = """
import json, sys, torch
if sys.argv[1] == "ipex":
    import intel_extension_for_pytorch  # noqa: F401
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.LayerNorm(8))
torch.compile(model, backend="aot_eager")(torch.randn(4, 8)).pow(2).sum().backward()
print(json.dumps([n for n, p in model.named_parameters() if p.grad is None]))
"""


def test_ipex_import_loses_layernorm_gradients_under_aot_autograd(ipex_env):
    """The study's verdict on compile(backend="ipex") and transformers: IPEX's, not the
    study's. Without the harness: importing IPEX 2.8 makes AOT autograd's trace of a
    LayerNorm cut the autograd path to everything before it."""
    cmd = [ipex_env["python"], "-c", LAYERNORM_REPRO]
    without = subprocess.run([*cmd, "plain"], capture_output=True, text=True, timeout=600)
    with_ipex = subprocess.run([*cmd, "ipex"], capture_output=True, text=True, timeout=600)
    assert without.returncode == 0 and with_ipex.returncode == 0, with_ipex.stderr[-2000:]
    assert json.loads(without.stdout.splitlines()[-1]) == []
    lost = json.loads(with_ipex.stdout.splitlines()[-1])
    assert lost == ["0.weight", "0.bias", "1.weight", "1.bias"]


def test_ipex_compile_of_bert_is_recorded_incorrect(quick_study, ipex_env, make_spec, tmp_path):
    """BERT-Tiny compiled with backend="ipex" trains 4 of its 41 parameter tensors with
    eager attention (the quick preset's run, through Snakemake), and fails with sdpa
    (through the harness here); never a throughput."""
    rec = quick_study.records["bert-tiny-ipex-compile"]
    assert rec["spec"]["attention"] == "eager" and rec["spec"]["compile"] == "ipex"
    assert rec["status"] == "incorrect", rec.get("error")
    assert rec["error"]["type"] == "IncorrectStep"
    assert rec["error"]["message"].startswith(
        "the step trained 4 of 41 parameter tensors (37 got no gradient: "
        "bert.embeddings.word_embeddings.weight"
    )
    assert "samples_per_s" not in rec["metrics"]
    assert rec["unchecked_metrics"]["samples_per_s"] > 0  # measured, kept apart
    got = rec["gradient_check"]["received"]
    assert got["parameters"] == 41 and got["with_gradient"] == 4
    spec = make_spec(
        id="bert-ipex-compile-sdpa", model="bert-tiny", backend="ipex", compile="ipex",
        attention="sdpa",
    )  # fmt: skip
    sdpa = run(spec, ipex_env, tmp_path)
    assert sdpa["status"] == "failed"
    assert "_scaled_dot_product_flash_attention_for_cpu_backward" in sdpa["error"]["message"]


def test_ipex_optimize_and_bf16_pass_the_check(ipex_env, make_spec, tmp_path):
    """ipex.optimize's packed convolution weights are compared in torch's layout, and its
    fused SGD step replaces torch's; with AdamW (no fused CPU kernel in IPEX 2.8) torch's
    own step runs."""
    spec = make_spec(
        id="resnet-ipex", model="resnet18", image_size=64, batch_size=4, backend="ipex",
        ipex_optimize=True,
    )  # fmt: skip
    rec = assert_ok(run(spec, ipex_env, tmp_path), torch="2.8.")
    check = rec["gradient_check"]
    assert check["ok"] and check["received"]["with_gradient"] == 62
    assert check["comparison"]["compared"] == 62 and check["comparison"]["unmatched"] == []
    assert check["comparison"]["max_rel_error"] < 1e-3
    opt = rec["checks"]["optimizer"]
    assert opt["class"] == "SGD" and opt["ipex_fused_step"], opt
    assert opt["step"].startswith("intel_extension_for_pytorch.")
    spec = make_spec(
        id="bert-ipex-adamw", model="bert-tiny", backend="ipex", ipex_optimize=True,
        lr=1e-3, lr_warmup_steps=0,
    )  # fmt: skip
    rec = assert_ok(run(spec, ipex_env, tmp_path), torch="2.8.")
    opt = rec["checks"]["optimizer"]
    assert opt["class"] == "AdamW" and not opt["ipex_fused_step"], opt
    assert opt["parameters"] == 41 and rec["gradient_check"]["ok"]
    assert rec["losses"][-1] < rec["losses"][0]
    # in bf16, ipex.optimize holds the weights in bf16: its gradients are a bf16 model's
    # (~10x bf16 autocast's error on BERT's LayerNorm biases), judged against eager with
    # bf16 weights; where the CPU cannot prepack bf16 weights, the record says so
    bf16 = run({**spec, "id": "bert-ipex-bf16", "precision": "bf16"}, ipex_env, tmp_path)
    if bf16["status"] != "ok":
        assert "BF16 weight prepack needs" in bf16["error"]["message"], bf16["error"]
    else:
        check = bf16["gradient_check"]
        assert check["ok"], check["comparison"]["over_limit"]
        assert check["comparison"]["own_precision_reference"] == "eager with bf16 weights"
        assert check["received"]["with_gradient"] == 41


@pytest.mark.parametrize("impl", ["default", "foreach", "fused"])
def test_adamw_implementations_train(upstream_env, make_spec, tmp_path, impl):
    spec = make_spec(
        id=f"adamw-{impl}", model="bert-tiny", optimizer_impl=impl, lr=1e-3, lr_warmup_steps=0,
        steps=6,
    )  # fmt: skip
    rec = assert_ok(run(spec, upstream_env, tmp_path))
    opt = rec["checks"]["optimizer"]
    assert opt["class"] == "AdamW"
    assert opt["foreach"] is (True if impl == "foreach" else None)
    assert opt["fused"] is (True if impl == "fused" else None)
    assert rec["losses"][-1] < rec["losses"][0] - 0.01, rec["losses"]
    check = rec["gradient_check"]
    # fused and foreach are other steps, not another gradient: the check compares the
    # first step's gradients (plain eager here: its own reference), all 41 received
    assert check["ok"] and check["received"]["with_gradient"] == 41
    # the linear schedule without warm-up: the rate falls to 0 at the last step
    assert rec["checks"]["last_lr"] == 0.0


def test_bf16_and_compiled_runs_are_compared_with_fp64_and_eager(upstream_env, make_spec, tmp_path):
    bf16 = assert_ok(run(make_spec(id="bf16", precision="bf16"), upstream_env, tmp_path))
    cmp = bf16["gradient_check"]["comparison"]
    # plain eager bf16 is its own second reference: its distance from fp64 is recorded
    assert cmp["own_precision_reference"] == "the run itself (plain eager)"
    assert 0 < cmp["max_rel_error"] < 1 and cmp["compared"] == 10
    # a later trial carries the first's comparison and FLOP count (trial/carry.py) and
    # still checks its own step's gradients
    later = assert_ok(run(make_spec(id="bf16", precision="bf16"), upstream_env, tmp_path / "t1",
                          index=1, first_trial=tmp_path / "records" / "bf16.json"))  # fmt: skip
    check = later["gradient_check"]
    assert later["carried"]["from"] == "trial 0" and "carried" not in later["spec"]
    assert check["comparison"] == cmp and check["comparison_from"] == "trial 0"
    assert check["ok"] and check["received"]["with_gradient"] == 10
    # no reference of its own: the first trial's (not a timing: on an AVX2 machine the
    # first trial's fp64 step took 0.03 s, the later one's look at its gradients 0.09 s)
    assert bf16["gradient_check"]["reference"] == "fp64 eager and eager at the run's precision"
    assert check["reference"] == "fp64 eager and eager at the run's precision, trial 0's"
    m = later["metrics"]
    assert m["flops_count_s"] == 0 and m["flops_per_sample"] == bf16["metrics"]["flops_per_sample"]
    spec = make_spec(id="ind-bf16", backend="inductor", precision="bf16", channels_last=True)
    rec = assert_ok(run(spec, upstream_env, tmp_path))
    check = rec["gradient_check"]
    assert check["ok"] and check["comparison"]["own_precision_reference"] == "eager"
    assert check["comparison"]["over_limit"] == []
    assert check["check_s"] > 0 and rec["metrics"]["grad_check_s"] == check["check_s"]
    plain = assert_ok(run(make_spec(id="plain"), upstream_env, tmp_path))
    assert plain["gradient_check"]["comparison"] is None  # its own reference
    assert plain["gradient_check"]["received"]["with_gradient"] == 10


DETACHED = '''

class DetachedCNN(SmallCNN):
    """A user's model whose forward cuts the autograd path below its classifier."""

    def forward(self, x):
        return self.classifier(self.features(x).detach())
'''


def test_a_model_that_detaches_a_block_is_incorrect(upstream_env, make_spec, tmp_path):
    """A model added as docs/extending.md says (one declaration, its constructor), whose forward
    detaches its features: plain fp32 eager is its own reference, and the step still
    does not count."""
    from tests.runs import copy_workflow

    wd = copy_workflow(tmp_path / "wf")
    workloads = wd / "workflow_scripts/workloads.py"
    text = workloads.read_text()
    anchor = '        Workload(\n            "cnn",'
    assert anchor in text
    decl = (
        '        Workload("detached", "vision", "image-classification", "a CNN whose features '
        'are detached", 10, (300.0, 4.0), 25.0),\n'
    )
    workloads.write_text(text.replace(anchor, decl + anchor, 1))
    models = wd / "workflow_scripts/rank/models.py"
    text = models.read_text()
    text = text.replace(
        '    if name == "cnn":\n', '    if name == "detached":\n        return DetachedCNN()\n'
        '    if name == "cnn":\n', 1,
    )  # fmt: skip
    models.write_text(text + DETACHED)
    code = """
import json, sys
from workflow_scripts.rank import harness
spec = json.loads(sys.argv[1])
rec = harness.run(spec)
open(sys.argv[2], "w").write(json.dumps(rec))
check = rec.get("gradient_check")
print(json.dumps({"status": rec["status"], "error": rec["error"], "check": check}))
"""
    spec = {**make_spec(id="detached"), "model": "detached"}
    first = tmp_path / "trial0.json"
    got = last_json(env_python(upstream_env, code, json.dumps(spec), str(first), cwd=wd))
    assert got["status"] == "incorrect", got
    assert got["error"]["message"] == (
        "the step trained 4 of 10 parameter tensors (6 got no gradient: features.0.weight, "
        "features.0.bias, features.3.weight, features.3.bias, features.6.weight, "
        "features.6.bias)"
    )
    assert got["check"]["comparison"] is None  # plain fp32 eager: no reference needed
    # a later trial of it takes the same step: it runs nothing and says why, in its
    # record and its log (trial/carry.py, incorrect_first)
    later = run(spec, upstream_env, tmp_path / "t1", index=1, first_trial=first)
    assert later["status"] == "incorrect" and later["trial"] == 1
    assert later["error"]["type"] == "IncorrectStep"
    assert later["error"]["message"].startswith(
        f"not run: its first trial's step was incorrect ({got['error']['message']}), "
    )
    assert "metrics" not in later or not later["metrics"].get("samples_per_s")
    log = (tmp_path / "t1" / "logs" / "detached.log").read_text()
    assert "[launch] not run: its first trial's step was incorrect" in log
    assert "step 1/" not in log  # no step ran
    shutil.rmtree(wd, ignore_errors=True)


def test_dynamic_padding_counts_real_tokens_and_recompiles(quick_study, make_spec):
    """BERT-Tiny on dynamically padded batches through inductor, with fused AdamW (the
    quick preset's run): the tokens it trained on are counted, each new length
    recompiles, and the step passes the gradient check."""
    rec = assert_ok(quick_study.records["bert-tiny-inductor-dynamic"])
    spec, m = rec["spec"], rec["metrics"]
    assert spec["padding"] == "dynamic" and spec["compile"] == "inductor"
    n = spec["seq_len"]
    assert 0.2 * n < m["tokens_per_sample"] < m["padded_tokens_per_sample"] <= n
    fixed = make_spec(id="fixed", model="bert-tiny", seq_len=n, steps=1, warmup_steps=1)
    # FLOPs at the lengths padded to: fewer than at the full length, more than at the mean
    from workflow_scripts import workloads
    from workflow_scripts.plan import estimate

    assert m["flops_per_sample"] < estimate.train_flops_per_sample(fixed)
    w = workloads.get("bert-tiny")
    assert m["flops_per_sample"] > 3 * w.forward_flops(
        {"seq_len": math.floor(m["tokens_per_sample"])}
    )
    compiled = rec["checks"]["compile"]
    assert compiled["recompiles_after_first_step"] >= 1 and compiled["compile_s"] > 0
    assert rec["checks"]["compiled"] and rec["gradient_check"]["ok"]
    row_tokens = rec["metrics"]["samples_per_s"] * m["tokens_per_sample"]
    from workflow_scripts.summary import records

    assert records.flatten(rec)["tokens_per_s"] == pytest.approx(row_tokens)


def test_another_experiment_takes_the_same_reference_step_and_compares_the_same(
    upstream_env, make_spec, tmp_path
):
    """The fp64 reference step of one model, weights and batch is made once: a first
    trial of another experiment that asks for the same step reads it (references.py),
    and its comparison comes out exactly as one that made its own. One this experiment
    made (an earlier attempt of its trial, rerun for noise) is its own, not shared."""
    from workflow_scripts.rank import references

    study, alone = tmp_path / "study", tmp_path / "alone"
    a = assert_ok(run(make_spec(id="a", precision="bf16"), upstream_env, study))
    made = sorted((study / references.FOLDER).glob("*.json"))
    assert len(made) == 1 and "shared_references" not in a["gradient_check"]["comparison"]
    meta = json.loads(made[0].read_text())
    assert meta["experiment"] == "a" and meta["plan"]["kind"] == "fp64"
    # a's own reference, read again (as a noise rerun's attempt does, the same step): its
    # own, not shared, and the same comparison
    again = assert_ok(run(make_spec(id="a", precision="bf16"), upstream_env, study))
    assert again["gradient_check"]["comparison"] == a["gradient_check"]["comparison"]
    # another rung of the same step (AdamW: another update, the same first gradients)
    spec = make_spec(id="b", precision="bf16", optimizer="adamw", lr=1e-3)
    b = assert_ok(run(spec, upstream_env, study))
    own = assert_ok(run(spec, upstream_env, alone))  # the same, in a study of its own
    shared, fresh = b["gradient_check"]["comparison"], own["gradient_check"]["comparison"]
    assert shared.pop("shared_references") == {"fp64": "a"}
    assert shared == fresh and b["gradient_check"]["ok"]
    assert "shared_references" not in fresh
    # the estimate knew it would read it (0.5 s) rather than make it
    assert b["estimate"]["parts"]["grad_check"] < own["estimate"]["parts"]["grad_check"]
    # a reference whose runtime key differs (here: another batch, as a changed data
    # loader would give) is not used: the step is made again
    meta["runtime"]["batch"] = "0" * 64
    made[0].write_text(json.dumps(meta))
    again = assert_ok(run({**spec, "id": "c"}, upstream_env, study))
    assert "shared_references" not in again["gradient_check"]["comparison"]
    assert again["gradient_check"]["comparison"]["max_rel_error"] == fresh["max_rel_error"]
    assert json.loads(made[0].read_text())["experiment"] == "c"
    # a different batch size is another step: not shared
    other = assert_ok(run(make_spec(id="d", precision="bf16", batch_size=8), upstream_env, study))
    assert "shared_references" not in other["gradient_check"]["comparison"]
    assert len(list((study / references.FOLDER).glob("*.pt"))) == 2


@pytest.mark.skipif(not TWO_CPUS, reason="two ranks need two CPUs")
def test_each_rank_shares_its_reference_step_across_process_groups_and_environments(
    upstream_env, oneccl_env, make_spec, tmp_path
):
    """A data-parallel run keeps each rank's reference steps (references.py, ``rank`` in
    the plan key) before the ranks average them; another data-parallel run of the same
    model, ranks and batch reads them, here over another process group in another
    environment of the same torch (Gloo in upstream, then oneCCL in oneccl), and its
    comparison comes out exactly as one that made its own."""
    from workflow_scripts.rank import references

    study, alone = tmp_path / "study", tmp_path / "alone"
    fields = dict(launcher="torchrun", ranks=2, threads=1)
    gloo = make_spec(id="gloo", dist_backend="gloo", **fields)
    ccl = make_spec(id="ccl", dist_backend="ccl", **fields)
    assert (gloo["env"], ccl["env"]) == ("upstream", "oneccl")
    made = assert_ok(run(gloo, upstream_env, study))
    assert made["gradient_check"]["ok"]
    assert "shared_references" not in made["gradient_check"]["comparison"]
    plans = [json.loads(p.read_text())["plan"] for p in (study / references.FOLDER).glob("*.json")]
    assert sorted((p["kind"], p["rank"]) for p in plans) == [
        ("fp32", 0), ("fp32", 1), ("fp64", 0), ("fp64", 1)
    ]  # fmt: skip
    assert all(references.known(study / "records" / "x.json", ccl, k) for k in ("fp64", "fp32"))
    read = assert_ok(run(ccl, oneccl_env, study))
    own = assert_ok(run(ccl, oneccl_env, alone))
    shared, fresh = read["gradient_check"]["comparison"], own["gradient_check"]["comparison"]
    assert shared.pop("shared_references") == {"fp64": "gloo", "fp32": "gloo"}
    assert shared == fresh and read["gradient_check"]["ok"]
    # the trial's estimate knew it would read them (0.5 s each) rather than make them
    assert read["estimate"]["parts"]["grad_check"] < own["estimate"]["parts"]["grad_check"]
