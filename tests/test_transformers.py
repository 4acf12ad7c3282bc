"""The transformer workloads trained for real: tiny BERT and GPT-2 (Hugging Face
transformers, random weights from the configuration in workflow_scripts/workloads.py)
through the harness in the upstream and IPEX environments; and inference mode."""

from __future__ import annotations

import json
import math

import pytest

from tests.conftest import env_python
from tests.trials import assert_ok, run
from workflow_scripts import workloads
from workflow_scripts.plan import estimate
from workflow_scripts.summary import records

pytestmark = [pytest.mark.slow, pytest.mark.torch]


def text_record(rec: dict) -> dict:
    """The checks every text run passes: token inputs, the counted FLOPs equal to the
    hand count of the model's declaration, and its throughput in tokens."""
    spec, m = rec["spec"], rec["metrics"]
    assert not rec["checks"]["input_channels_last"]
    assert m["flops_per_sample"] == estimate.train_flops_per_sample(spec)
    row = records.flatten(rec)
    assert row["seq_len"] == spec["seq_len"] and math.isnan(row["image_size"])
    assert row["tokens_per_s"] == pytest.approx(m["samples_per_s"] * spec["seq_len"])
    return rec


def test_bert_and_gpt2_train_in_the_upstream_environment(upstream_env, make_spec, tmp_path):
    bert = assert_ok(run(make_spec(id="bert", model="bert-tiny"), upstream_env, tmp_path))
    text_record(bert)
    assert bert["checks"]["output_dtype"] == "float32"
    # two classes from random weights: the first loss is near ln 2, and it falls on the
    # one repeated batch
    assert bert["losses"][0] == pytest.approx(math.log(2), abs=0.15)
    assert bert["losses"][-1] < bert["losses"][0]
    # a causal LM on per-sample token ids through a DataLoader worker, in bf16: its
    # first loss is near ln(vocabulary) (next-token labels over 8192 tokens)
    spec = make_spec(
        id="gpt", model="gpt2-tiny", seq_len=32, precision="bf16", data="per_sample",
        num_workers=1, batch_size=2,
    )  # fmt: skip
    gpt = text_record(assert_ok(run(spec, upstream_env, tmp_path)))
    assert gpt["checks"]["output_dtype"] == "bfloat16" and gpt["checks"]["dataloader_workers"] == 1
    assert gpt["losses"][0] == pytest.approx(math.log(8192), abs=0.3)


def test_bert_compiles_with_inductor(upstream_env, make_spec, tmp_path):
    spec = make_spec(id="bert-inductor", model="bert-tiny", backend="inductor", seq_len=64)
    rec = text_record(assert_ok(run(spec, upstream_env, tmp_path)))
    assert rec["checks"]["compiled"]
    # trial 0: in a fresh compile cache of its own, beside its record, left there for the
    # experiment's later trials (trial/carry.py)
    cache = rec["provenance"]["compile_cache"]
    assert cache["fresh"] is True and cache["kept"] is True
    assert rec["provenance"]["env"]["TORCHINDUCTOR_CACHE_DIR"] == cache["dir"]
    assert cache["dir"] == str((tmp_path / "records" / "compile-cache").resolve())
    hits = rec["checks"]["compile"]["cache"]
    assert hits["fxgraph_cache_miss"] > 0 and hits["fxgraph_cache_hit"] == 0, hits


def test_dropout_is_the_models_own_and_the_checked_step_runs_without_it(
    upstream_env, make_spec, tmp_path
):
    """dropout: true builds the transformer with its config's own dropout (0.1); its
    first step, the gradient check's, runs without it (eval mode) as its references do,
    so the check still compares like with like, eager and compiled; from the second
    step on it trains with it."""
    own = env_python(
        upstream_env,
        "from workflow_scripts.rank import models\n"
        "import torch\n"
        "for flag in (False, True):\n"
        "    m = models.build('bert-tiny', dropout=flag)\n"
        "    ps = {d.p for d in m.modules() if isinstance(d, torch.nn.Dropout)}\n"
        "    print(m.config.hidden_dropout_prob, m.config.attention_probs_dropout_prob, max(ps))\n",
    )
    assert own.split("\n")[:2] == ["0.0 0.0 0.0", "0.1 0.1 0.1"], own
    common = {"model": "bert-tiny", "seq_len": 64, "warmup_steps": 2, "steps": 4}
    off = assert_ok(run(make_spec(id="off", **common), upstream_env, tmp_path))
    on = assert_ok(run(make_spec(id="on", dropout=True, **common), upstream_env, tmp_path))
    assert on["spec"]["dropout"] is True and off["spec"]["dropout"] is False
    # the same weights and batch; the checked first step without dropout: the same loss
    assert on["losses"][0] == pytest.approx(off["losses"][0], rel=1e-5)
    # then dropout: another trajectory
    assert all(a != b for a, b in zip(on["losses"][1:], off["losses"][1:])), (on, off)
    for rec in (on, off):
        check = rec["gradient_check"]
        assert check["ok"], check
    spec = make_spec(id="on-inductor", dropout=True, backend="inductor", **common)
    compiled = assert_ok(run(spec, upstream_env, tmp_path))
    assert compiled["gradient_check"]["ok"], compiled["gradient_check"]
    # its gradients compared with eager's without dropout: like with like
    compared = compiled["gradient_check"]["comparison"]
    assert compared["compared"] > 0 and not compared["over_limit"], compared
    assert compared["loss_rel_error"] < compared["loss_tolerance"], compared
    assert compiled["losses"][0] == pytest.approx(on["losses"][0], rel=1e-3)
    # eval mode for the first step, train mode after: compiled once more
    assert compiled["checks"]["compile"]["recompiles_after_first_step"] >= 1


def test_gpt2_through_ipex_optimize(ipex_env, make_spec, tmp_path):
    spec = make_spec(id="gpt-ipex", model="gpt2-tiny", backend="ipex", ipex_optimize=True)
    rec = run(spec, ipex_env, tmp_path)
    assert rec["status"] == "ok", rec.get("error")
    # counted before IPEX's import, which hides a transformer's backward from the counter
    text_record(rec)
    assert rec["provenance"]["versions"]["torch"].startswith("2.8.")
    assert rec["provenance"]["versions"].get("transformers")


def inference_record(rec: dict) -> dict:
    """An inference run: the forward pass alone (its FLOPs a third of a training
    step's), and nothing learnt: every step's loss is the same."""
    rec = assert_ok(rec)
    assert rec["metrics"]["flops_per_sample"] == estimate.train_flops_per_sample(rec["spec"])
    assert max(rec["losses"]) - min(rec["losses"]) < 1e-5, rec["losses"]
    dist = rec["metrics"]["step_time_s"]
    assert 0 < dist["median"] <= dist["p99"]  # batch 1: the latency distribution
    return rec


def test_bert_inference_at_batch_1(upstream_env, make_spec, tmp_path):
    spec = make_spec(id="bert-infer", model="bert-tiny", mode="inference", batch_size=1, steps=20)
    rec = inference_record(text_record(run(spec, upstream_env, tmp_path)))
    assert rec["metrics"]["flops_per_sample"] * 3 == estimate.train_flops_per_sample(
        {**spec, "mode": "train"}
    )


def test_inference_through_ipex_optimize(ipex_env, make_spec, tmp_path):
    spec = make_spec(id="cnn-infer", mode="inference", backend="ipex", ipex_optimize=True)
    rec = run(spec, ipex_env, tmp_path)
    assert rec["status"] == "ok", rec.get("error")
    assert max(rec["losses"]) - min(rec["losses"]) < 1e-5, rec["losses"]
    assert rec["metrics"]["flops_per_sample"] == estimate.train_flops_per_sample(spec)


def test_the_keyword_task_needs_word_order(upstream_env):
    """The generated text task: every sequence holds a keyword of each class, so the
    words alone say nothing of the label (the class whose keyword comes first): a
    bag-of-words count of the held-out split's keywords scores chance."""
    code = """
import json, torch
from workflow_scripts import workloads
from workflow_scripts.rank import data
w = workloads.get("bert-tiny")
train, test = data.keyword_task(w, 32)
x, n, y = test.tensors
k = workloads.KEYWORDS_PER_CLASS
kw = x >= workloads.KEYWORDS_FIRST_TOKEN + workloads.KEYWORDS_BACKGROUND
# the same keyword pair in both orders has both labels: a bag of words cannot tell them
pairs = {}
for row, label in zip(x.tolist(), y.tolist()):
    words = [t for t in row if t >= workloads.KEYWORDS_FIRST_TOKEN + workloads.KEYWORDS_BACKGROUND]
    pairs.setdefault(frozenset(words), set()).add(label)
print(json.dumps({"per_sequence": kw.sum(1).tolist(), "balance": float(y.float().mean()),
    "both_labels": sum(len(v) == 2 for v in pairs.values()),
    "n": int(n[0]), "labels": sorted(set(y.tolist()))}))
"""
    got = json.loads(env_python(upstream_env, code))
    assert set(got["per_sequence"]) == {2} and got["n"] == 32 and got["labels"] == [0, 1]
    assert 0.4 < got["balance"] < 0.6 and got["both_labels"] > 20


def test_bert_learns_the_keyword_task(upstream_env, make_spec, tmp_path):
    """The generated text-classification task is learnable, and needs attention with
    positions: BERT-Tiny from random weights, trained as Hugging Face's examples train
    (AdamW, linear schedule), scores far above chance (1/2) on the held-out split
    after 4 epochs."""
    spec = make_spec(
        id="keywords", model="bert-tiny", image_size=None, seq_len=32, data="keywords",
        batch_size=32, lr=1e-3, lr_warmup_steps=0, epochs=4, warmup_steps=1,
        time_budget_s=None, target_accuracy=0.8, evals_per_epoch=2,
    )  # fmt: skip
    rec = run(spec, upstream_env, tmp_path)
    assert rec["status"] == "ok", rec.get("error")
    m = rec["metrics"]
    assert m["steps_per_epoch"] == workloads.KEYWORDS_TRAIN // 32
    assert m["test_samples"] == workloads.KEYWORDS_TEST
    assert m["test_accuracy"] > 0.8, m["test_accuracy"]
    assert 0 < m["time_to_accuracy_s"] <= m["train_time_s"]
    assert rec["losses"][-1] < rec["losses"][0]
    assert rec["checks"]["optimizer"]["class"] == "AdamW"
    # the linear schedule decays to 0 at the last step
    assert rec["checks"]["last_lr"] == 0.0
