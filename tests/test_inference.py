"""Inference as it is served, in the real backend environments: INT8 through IPEX and
through PT2E with inductor (the record says which kernels ran) of a model the study
trains once (read from the quick preset's run), a model quantized in part, bf16 and
IPEX's TorchScript path."""

from __future__ import annotations

import hashlib
import json
import subprocess

import pytest

from tests.runs import REPO
from tests.trials import assert_ok, run
from workflow_scripts.summary import records

pytestmark = [pytest.mark.slow, pytest.mark.torch]

#: the quantized digits model scores within this many points of the fp32 model it came
#: from (static post-training INT8, per-channel weights: a small CNN loses well under one
#: point; three is room for a different calibration draw, not for a broken model)
ACCURACY_TOLERANCE = 0.03
INT8 = {
    "inductor": {"backend": "inductor", "precision": "int8", "compile_freezing": True},
    "ipex": {"backend": "ipex", "precision": "int8", "ipex_torchscript": True},
}
TORCH = {"inductor": "2.14.", "ipex": "2.8."}


def cpu_flags(record: dict) -> set[str]:
    return set(record["provenance"].get("cpu_flags") or [])


def assert_int8(record: dict, stack: str) -> dict:
    """An INT8 run of the small CNN: each of its weight layers ran as a oneDNN kernel with
    8-bit weights (no silent fp32 fallback), on a CPU feature the machine has, and the
    backend's INT8 path is named."""
    serving = record["checks"]["serving"]
    kernels = serving["onednn"]
    # the CNN's 5 weight layers (3 convolutions, 2 linear), each an INT8 oneDNN kernel
    assert serving["weight_layers"] == 5
    assert kernels["int8_primitives"] == kernels["heavy_primitives"] == 5, kernels["primitives"]
    assert (
        serving["int8"]
        and ("PT2E" if stack == "inductor" else "ipex.quantization") in (serving["int8"])
    )
    flags = cpu_flags(record)
    needs = {"AMX-INT8": {"amx_int8"}, "AVX512-VNNI": {"avx512_vnni"}, "AVX-VNNI": {"avx_vnni"}}
    isa = kernels["int8_isa"]
    assert isa in (*needs, "no VNNI/AMX"), isa
    assert needs.get(isa, set()) <= flags, (isa, sorted(flags))
    row = records.flatten(record)
    assert row["int8_share"] == 1.0 and row["int8_isa"] == isa
    assert row["precision"] == "int8"
    return serving


#: the quick preset's digits CNN, trained once, served in fp32 eager and in INT8 by each
#: stack (tests.runs.QuickStudy: its runs in images, through Snakemake)
SERVED = {"fp32": "serve-digits-fp32", **{s: f"serve-digits-int8-{s}" for s in INT8}}


def test_both_stacks_quantize_the_weights_one_run_trained(quick_study):
    """Trained once in the study: the fp32 eager run trains the digits CNN and keeps its
    weights; each stack's INT8 run loads them (no training of its own), runs each weight
    layer as an INT8 kernel, agrees with fp32 eager's logits, and scores within the
    stated tolerance of the same weights in fp32 eager."""
    fp32 = assert_ok(quick_study.records[SERVED["fp32"]])
    reference = fp32["checks"]["serving"]
    saved = reference["pretrain"]
    epochs = fp32["spec"]["epochs"]
    assert saved["weights"] == "saved" and saved["steps"] == epochs * (1437 // 32)
    assert (quick_study.wd / "results/records/serve-digits-fp32/trial0.weights.pt").is_file()
    assert reference["reference_accuracy"] > 0.5, reference  # the fp32 model learnt (0.1)
    assert reference["served_accuracy"] == reference["reference_accuracy"]  # served as is
    assert reference["int8"] is None and reference["onednn"]["int8_primitives"] == 0
    for stack in INT8:
        rec = assert_ok(quick_study.records[SERVED[stack]], torch=TORCH[stack])
        serving = assert_int8(rec, stack)
        loaded = serving["pretrain"]
        assert loaded["weights"] == "loaded from serve-digits-fp32 (trial 0)"
        assert loaded["weights_sha256"] == saved["weights_sha256"]
        # the same weights in fp32 eager, in this stack's torch: the same model
        assert serving["reference_accuracy"] == pytest.approx(reference["reference_accuracy"],
                                                              abs=1 / 360)  # fmt: skip
        served = serving["served_accuracy"]
        assert abs(served - serving["reference_accuracy"]) <= ACCURACY_TOLERANCE, serving
        row = records.flatten(rec)
        assert row["test_accuracy"] == served
        assert row["accuracy_change"] == pytest.approx(served - serving["reference_accuracy"])
        # the served model's logits against fp32 eager's on the run's first batch
        agreement = serving["agreement"]
        assert agreement["cosine"] > 0.99, agreement
        assert agreement["max_abs_diff"] < 0.2 * agreement["reference_max_abs"], agreement
        assert serving["serve_s"] > 0
        assert rec["metrics"]["ceiling_gflops"] is None  # no float ceiling bounds INT8
        assert rec["checks"]["compiled"] == (stack == "inductor")


def test_bf16_inference_records_bf16(upstream_env, make_spec, tmp_path):
    """bf16 autocast in effect on a served transformer, eager and compiled with freezing;
    where the CPU has native bf16, oneDNN's kernels ran in bf16."""
    for fields in ({}, {"backend": "inductor", "compile_freezing": True}):
        spec = make_spec(
            id="bf16-" + (fields.get("backend") or "eager"), model="bert-tiny", seq_len=32,
            mode="inference", precision="bf16", batch_size=2, **fields,
        )  # fmt: skip
        rec = assert_ok(run(spec, upstream_env, tmp_path))
        assert rec["checks"]["output_dtype"] == "bfloat16"
        serving = rec["checks"]["serving"]
        assert serving["agreement"]["cosine"] > 0.98, serving["agreement"]
        assert serving["onednn"]["int8_primitives"] == 0
        if not fields and "avx512_bf16" in cpu_flags(rec):
            assert serving["onednn"]["bf16_primitives"] > 0, serving["onednn"]


def test_a_later_ipex_int8_trial_quantizes_from_the_first_ones_calibration(
    ipex_env, make_spec, tmp_path
):
    """IPEX's INT8 calibration (its observers' scales) is made once: trial 0 keeps its
    qconf summary beside its record, a later trial loads it instead of running the
    calibration batches through the observers, and serves the same quantized model (the
    same logits on the run's first batch). A file that is not the one trial 0's record
    names is not carried: that trial calibrates for itself."""
    spec = make_spec(id="q", mode="inference", **INT8["ipex"])
    first = assert_ok(run(spec, ipex_env, tmp_path), torch=TORCH["ipex"])
    made = first["checks"]["serving"]["int8_calibration"]
    kept = tmp_path / "records" / "q.int8-calibration.json"
    assert made["how"] == "calibrated, kept" and made["path"] == str(kept)
    assert made["sha256"] == hashlib.sha256(kept.read_bytes()).hexdigest()
    record = tmp_path / "records" / "q.json"
    later = assert_ok(run(spec, ipex_env, tmp_path / "t1", index=1, first_trial=record),
                      torch=TORCH["ipex"])  # fmt: skip
    assert later["carried"]["int8_calibration"] == str(kept.resolve())
    serving = later["checks"]["serving"]
    assert serving["int8_calibration"] == {**made, "how": "carried", "path": str(kept.resolve())}
    assert serving["agreement"] == first["checks"]["serving"]["agreement"]
    assert_int8(later, "ipex")
    assert not (tmp_path / "t1" / "records" / "q.int8-calibration.json").exists()
    kept.write_text(kept.read_text().replace("0", "1", 1))  # not trial 0's file any more
    other = assert_ok(run(spec, ipex_env, tmp_path / "t2", index=2, first_trial=record),
                      torch=TORCH["ipex"])  # fmt: skip
    assert "int8_calibration" not in (other.get("carried") or {})
    assert other["checks"]["serving"]["int8_calibration"]["how"] == "calibrated, kept"
    # a file that is trial 0's but cannot be read: the later trial calibrates, and says so
    kept.write_text("not a qconf summary")
    first["checks"]["serving"]["int8_calibration"]["sha256"] = hashlib.sha256(
        kept.read_bytes()
    ).hexdigest()
    record.write_text(json.dumps(first, default=str))
    broken = assert_ok(run(spec, ipex_env, tmp_path / "t3", index=3, first_trial=record),
                       torch=TORCH["ipex"])  # fmt: skip
    assert broken["carried"]["int8_calibration"] == str(kept.resolve())
    how = broken["checks"]["serving"]["int8_calibration"]["how"]
    assert how.startswith("carried file unusable (") and how.endswith("); calibrated"), how
    assert broken["checks"]["serving"]["agreement"] == first["checks"]["serving"]["agreement"]


def test_a_later_trial_serves_the_weights_its_first_trial_trained(
    upstream_env, make_spec, tmp_path
):
    """A served model that the run trains itself (``epochs``, no ``weights_from``) is
    trained once per configuration: trial 0 keeps its weights beside its record, a later
    trial loads them (trial/carry.py) instead of training again and serves the same
    model (the same held-out accuracy and logits). A file that is not the one trial 0's
    record names is not carried: that trial trains for itself."""
    from workflow_scripts import digits

    folder = tmp_path / "digits"
    digits.export(folder)
    data = {"data_path": str(folder)}
    spec = make_spec(id="s", mode="inference", data="digits", epochs=1, batch_size=32, lr=0.02)
    first = assert_ok(run(spec, upstream_env, tmp_path, **data))
    saved = first["checks"]["serving"]["pretrain"]
    assert saved["weights"] == "saved" and saved["steps"] == 1437 // 32
    record, kept = tmp_path / "records" / "s.json", tmp_path / "records" / "s.weights.pt"
    later = assert_ok(run(spec, upstream_env, tmp_path / "t1", index=1, first_trial=record, **data))
    assert later["carried"]["weights"] == str(kept.resolve())
    serving = later["checks"]["serving"]
    loaded = serving["pretrain"]
    assert loaded["weights"] == "loaded from trial 0 (carried)" and "steps" not in loaded
    assert loaded["weights_sha256"] == saved["weights_sha256"]
    for key in ("reference_accuracy", "served_accuracy", "agreement"):
        assert serving[key] == first["checks"]["serving"][key], key
    assert later["estimate"]["parts"]["serve"] < first["estimate"]["parts"]["serve"]
    assert not (tmp_path / "t1" / "records" / "s.weights.pt").exists()
    kept.write_bytes(kept.read_bytes()[:-1])  # not trial 0's file any more
    other = assert_ok(run(spec, upstream_env, tmp_path / "t2", index=2, first_trial=record, **data))
    assert "weights" not in (other.get("carried") or {})
    assert other["checks"]["serving"]["pretrain"]["weights"] == "saved"


def test_ipex_serves_a_traced_frozen_graph(ipex_env, make_spec, tmp_path):
    """The IPEX deck's recipe: ipex.optimize, then torch.jit.trace and freeze."""
    spec = make_spec(
        id="ipex-jit", model="bert-tiny", seq_len=32, mode="inference", batch_size=1,
        backend="ipex", ipex_optimize=True, ipex_torchscript=True,
    )  # fmt: skip
    rec = assert_ok(run(spec, ipex_env, tmp_path), torch="2.8.")
    serving = rec["checks"]["serving"]
    assert serving["agreement"]["top1_agreement"] == 1.0, serving["agreement"]
    assert serving["agreement"]["cosine"] > 0.999
    assert serving["int8"] is None and serving["onednn"]["int8_primitives"] == 0


def test_a_model_quantized_in_part_says_so(upstream_env, make_spec, tmp_path):
    """GPT-2's layers are transformers' Conv1D (an addmm), which the quantizer leaves in
    fp32: only its LM head (a Linear) runs in INT8, and the record's share says so."""
    spec = make_spec(
        id="gpt2-int8", model="gpt2-tiny", seq_len=32, mode="inference", batch_size=1,
        **INT8["inductor"],
    )  # fmt: skip
    rec = assert_ok(run(spec, upstream_env, tmp_path))
    serving = rec["checks"]["serving"]
    assert serving["weight_layers"] == 2 * 4 + 1  # per block c_attn, c_proj, c_fc, c_proj
    assert serving["onednn"]["int8_primitives"] == 1, serving["onednn"]["primitives"]
    assert records.flatten(rec)["int8_share"] == pytest.approx(1 / 9)


PRETRAIN = """
import torch
from workflow_scripts import workloads
from workflow_scripts.rank import inference, models

class Batches:
    steps_per_epoch = 3

    def __next__(self):
        return torch.randn(4, 3, 32, 32), torch.randint(0, 10, (4,))

spec = {"epochs": 1, "optimizer": "sgd", "lr": 0.01, "lr_schedule": "constant",
        "optimizer_impl": "default", "lr_warmup_steps": 0, "lr_warmup_epochs": 0}
done = inference.pretrain(spec, models.build("cnn"), Batches(), workloads.get("cnn"))
assert done["steps"] == 3 and done["final_loss"] > 0, done
"""


def test_the_model_trained_before_serving_reads_its_loss_without_a_warning(upstream_env):
    """The served model's pre-training (``inference.pretrain``) reads its last loss
    without torch's warning about a tensor that requires grad (it was in the log of the
    run that trains a served model); any UserWarning fails it here."""
    proc = subprocess.run(
        [upstream_env["python"], "-W", "error::UserWarning", "-c", PRETRAIN],
        cwd=REPO, capture_output=True, text=True, timeout=300,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
