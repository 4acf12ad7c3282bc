"""The transformer workloads trained for real: tiny BERT and GPT-2 (Hugging Face
transformers, random weights from the configuration in workflow_scripts/workloads.py)
through the harness in the upstream and IPEX environments; and inference mode."""

from __future__ import annotations

import math

import pytest

from tests.test_harness import assert_ok, run
from workflow_scripts import estimate, records, workloads

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


def test_bert_learns_the_keyword_task(upstream_env, make_spec, tmp_path):
    """The generated text-classification task is learnable: BERT-Tiny from random
    weights scores well above chance (1/2) on the held-out split after 4 epochs."""
    spec = make_spec(
        id="keywords", model="bert-tiny", image_size=None, seq_len=32, data="keywords",
        batch_size=32, lr=0.005, epochs=4, warmup_steps=1, time_budget_s=None,
    )  # fmt: skip
    rec = run(spec, upstream_env, tmp_path)
    assert rec["status"] == "ok", rec.get("error")
    m = rec["metrics"]
    assert m["steps_per_epoch"] == workloads.KEYWORDS_TRAIN // 32
    assert m["test_samples"] == workloads.KEYWORDS_TEST
    assert m["test_accuracy"] > 0.6, m["test_accuracy"]
    assert rec["losses"][-1] < rec["losses"][0]
