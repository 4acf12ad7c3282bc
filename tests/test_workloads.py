"""The models' declarations (workflow_scripts/workloads.py): the transformer workloads'
FLOPs counted by hand, how a text model's spec resolves, and what its family refuses."""

from __future__ import annotations

import json

import pytest

from workflow_scripts import study, workloads
from workflow_scripts.plan import estimate
from workflow_scripts.study import machine


def load(**fields) -> dict:
    """The one resolved spec of an experiment (its id derived unless given)."""
    config = {"defaults": {"model": "cnn", "image_size": 32}, "groups": {"g": {"runs": [fields]}}}
    (spec,) = study.load_study(config).experiments
    return json.loads(json.dumps(spec))


def refused(**fields) -> str:
    with pytest.raises(study.StudyConfigError) as exc:
        load(**fields)
    return str(exc.value)


def test_transformer_flops_by_hand():
    # bert-tiny at 64 tokens, per layer and token: Q, K, V, output (4 x 128 x 128
    # multiply-adds), the MLP (128 x 512 twice), attention scores and context (64 x 128
    # twice); then the pooler (128 x 128) and the 2-way classifier on the first token
    per_token = 4 * 128 * 128 + 2 * 128 * 512 + 2 * 64 * 128
    bert = 2 * (64 * 2 * per_token + 128 * 128 + 128 * 2)
    assert workloads.get("bert-tiny").forward_flops({"seq_len": 64}) == bert
    # gpt2-tiny at 32 tokens: the same layer shapes (MLP 4 x 128), and the tied LM head
    # over the 8192-token vocabulary at every position
    per_token = 4 * 128 * 128 + 2 * 128 * 512 + 2 * 32 * 128
    gpt = 2 * (32 * 2 * per_token + 32 * 128 * 8192)
    assert workloads.get("gpt2-tiny").forward_flops({"seq_len": 32}) == gpt
    # a training step per sample: forward and backward (two matmuls per forward one)
    spec = {"model": "gpt2-tiny", "seq_len": 32}
    assert estimate.train_flops_per_sample(spec) == 3 * gpt
    # BERT-base at 128 tokens: ~22.4 GFLOP forward per sample (~175 MFLOP per token)
    assert workloads.get("bert-base").forward_flops({"seq_len": 128}) == pytest.approx(
        22.4e9, rel=0.01
    )


def test_every_model_is_a_value_of_the_model_field():
    schema = study.build_schema()
    assert schema["$defs"]["model"]["enum"] == workloads.names()
    for w in workloads.WORKLOADS.values():
        assert w.family in workloads.FAMILIES and w.help and w.compile_s > 0
        assert (w.seq_len is not None) == w.text == (w.hf_class is not None)


def test_a_text_models_spec_holds_its_sequence_length_and_no_image_size():
    spec = load(model="bert-tiny")
    assert spec["seq_len"] == 128 and spec["image_size"] is None
    assert spec["id"] == "bert-tiny-fp32-bs16"  # the model's own length: no tag
    assert load(model="gpt2-tiny", seq_len=64)["id"] == "gpt2-tiny-fp32-bs16-seq64"
    image = load(model="resnet18")
    assert image["seq_len"] is None and image["image_size"] == 32
    # a sweep over both families: each spec takes its own input size
    config = {"groups": {"g": {"runs": [{"name": "m", "model": ["cnn", "bert-tiny"]}]}}}
    specs = {s["model"]: s for s in study.load_study(config).experiments}
    assert specs["cnn"]["image_size"] == 224 and specs["cnn"]["seq_len"] is None
    assert specs["bert-tiny"]["image_size"] is None and specs["bert-tiny"]["seq_len"] == 128


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"model": "bert-tiny", "channels_last": True}, "channels_last needs an image model"),
        ({"model": "bert-tiny", "image_size": 64}, "image_size 64 needs an image model"),
        ({"model": "gpt2-tiny", "data": "digits"}, "data 'digits' needs an image model"),
        ({"model": "bert-tiny", "seq_len": 1024}, "seq_len 1024 is longer than the 512"),
        ({"model": "resnet18", "seq_len": 64}, "seq_len 64 needs a text model"),
        ({"model": "cnn", "image_size": None}, "image_size null needs a text model"),
        ({"model": "bert-large"}, "bert-large"),
    ],
)
def test_what_a_family_refuses(fields, message):
    assert message in refused(**fields)


def test_memory_warning_of_a_text_model_names_its_tokens():
    spec = load(model="gpt2", batch_size=512)
    fixed, activations = workloads.get("gpt2").memory_estimate_mb(spec)
    assert activations == 512 * workloads.get("gpt2").memory_mb[1]  # at its own 256 tokens
    warning = machine.memory_warning(spec, memory=fixed + activations)
    assert "batch 512 of gpt2 at 256 tokens needs roughly" in warning


def test_inference_mode_resolves_and_counts_the_forward_alone():
    spec = load(model="bert-tiny", mode="inference", batch_size=1)
    assert spec["id"] == "bert-tiny-infer-fp32-bs1"
    forward = workloads.get("bert-tiny").forward_flops(spec)
    assert estimate.train_flops_per_sample(spec) == forward
    assert estimate.train_flops_per_sample({**spec, "mode": "train"}) == 3 * forward


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (
            {"mode": "inference", "data": "per_sample", "epochs": 2, "time_budget_s": None},
            "epochs 2 in mode 'inference' trains the model before it is served and scores "
            "it on a held-out split: it needs data 'digits' or 'keywords' (got data "
            "'per_sample')",
        ),
        ({"precision": "int8"}, "precision 'int8' needs mode 'inference'"),
        (
            {"mode": "inference", "precision": "int8"},
            "precision 'int8' needs a backend with an INT8 path ('inductor' or 'ipex'; got "
            "backend 'eager')",
        ),
        (
            {"mode": "inference", "precision": "int8", "backend": "inductor"},
            "precision 'int8' with backend 'inductor' needs compile_freezing true",
        ),
        (
            {"mode": "inference", "precision": "int8", "backend": "ipex"},
            "precision 'int8' with backend 'ipex' needs ipex_torchscript true",
        ),
        (
            {
                "mode": "inference",
                "precision": "int8",
                "backend": "ipex",
                "ipex_torchscript": True,
                "ipex_optimize": True,
            },
            "runs ipex.quantization's prepare and convert, not ipex.optimize",
        ),  # fmt: skip
        ({"compile_freezing": True, "backend": "inductor"}, "compile_freezing needs mode"),
        ({"mode": "inference", "compile_freezing": True}, "compile_freezing needs compile"),
        ({"ipex_torchscript": True}, "ipex_torchscript true needs backend 'ipex'"),
        ({"ipex_torchscript": True, "backend": "ipex"}, "ipex_torchscript needs mode"),
        (
            {"mode": "inference", "launcher": "torchrun", "ranks": 2},
            "mode 'inference' runs one process (got launcher 'torchrun'",
        ),
        ({"mode": "predict"}, "mode"),
    ],
)
def test_what_inference_refuses(fields, message):
    assert message in refused(**fields)


def test_served_weights_come_from_a_run_that_trains_them_the_same_way():
    """weights_from names an experiment of the study that trains the same model the same
    way itself; anything else is refused with what differs."""
    train = {"mode": "inference", "data": "digits", "epochs": 2, "time_budget_s": None,
             "batch_size": 32}  # fmt: skip
    int8 = {**train, "backend": "inductor", "precision": "int8", "compile_freezing": True}

    def refused_study(*experiments) -> str:
        config = {"defaults": {"model": "cnn", "image_size": 32},
                  "groups": {"g": {"runs": list(experiments)}}}  # fmt: skip
        with pytest.raises(study.StudyConfigError) as exc:
            study.load_study(config)
        return str(exc.value)

    runs = [{"id": "fp32", **train}, {"id": "q", **int8, "weights_from": "fp32"}]
    ok = study.load_study(
        {"defaults": {"model": "cnn", "image_size": 32}, "groups": {"g": {"runs": runs}}}
    )
    assert [s["weights_from"] for s in ok.experiments] == [None, "fp32"]
    assert "weights_from 'nope' names no experiment" in refused_study(
        {"id": "q", **int8, "weights_from": "nope"}
    )
    msg = refused_study(
        {"id": "fp32", **train, "lr": 0.1}, {"id": "q", **int8, "weights_from": "fp32"}
    )
    assert "weights_from 'fp32' trains another model or another way (lr 0.01 vs 0.1)" in msg
    msg = refused_study({"id": "t", "data": "digits", "epochs": 2, "time_budget_s": None},
                        {"id": "q", **int8, "weights_from": "t"})  # fmt: skip
    assert "must name an inference experiment that trains its model itself" in msg
    assert "weights_from 'x' needs mode 'inference'" in refused(weights_from="x")
    assert "weights_from 'x' needs epochs" in refused(mode="inference", weights_from="x")
