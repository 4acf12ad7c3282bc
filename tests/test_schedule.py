"""A training's schedule (workflow_scripts/rank/schedule.py): the accuracy experiment's
arms as the loader resolves them (a fixed global batch, or a weak-scaled one: each
rank's batch fixed, the learning rate scaled and warmed up; seeds), the learning rate
step by step, the scoring points and the time to a target accuracy."""

from __future__ import annotations

import json

import pytest

from workflow_scripts import study
from workflow_scripts.rank import schedule

ACC = {"data": "digits", "epochs": 3, "time_budget_s": None, "model": "cnn", "image_size": 32}


def specs(config: dict) -> dict[str, dict]:
    s = study.load_study(config)
    return {i: json.loads(s.spec_json(i)) for i in s.ids}


def test_weak_scaling_multiplies_each_ranks_batch_and_the_rate_by_the_world():
    sweep = {"name": "w", "launcher": "torchrun", "layouts": "all", "cpus": "0-3",
             "batch_scaling": "weak", "batch_size": 16, "lr": 0.01, "seed": [0, 1, 2],
             **ACC}  # fmt: skip
    got = specs({"groups": {"g": {"runs": [sweep]}}})
    by_layout = {(s["ranks"], s["seed"]): (s["batch_size"], s["lr"]) for s in got.values()}
    assert by_layout == {
        (r, seed): (16 * r, pytest.approx(0.01 * r)) for r in (1, 2, 4) for seed in (0, 1, 2)
    }
    assert "w-seed1-r2-t2" in got  # a seed sweep: one experiment per seed
    # across nodes: the world is nodes x ranks
    exp = {"id": "n", "launcher": "torchrun", "ranks": 2, "nodes": 2, "threads": 1,
           "batch_scaling": "weak", "batch_size": 8, "lr": 0.1, **ACC}  # fmt: skip
    spec = specs({"groups": {"g": {"runs": [exp]}}})["n"]
    assert (spec["batch_size"], spec["lr"]) == (32, 0.4)
    # fixed (the default): batch_size is the global batch, the rate as written
    spec = specs({"groups": {"g": {"runs": [{**exp, "batch_scaling": "fixed"}]}}})["n"]
    assert (spec["batch_size"], spec["lr"]) == (8, 0.1)


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"lr_warmup_epochs": 1}, "lr_warmup_epochs 1 needs batch_scaling 'weak'"),
        (
            {"batch_scaling": "weak", "lr_warmup_epochs": 4},
            r"longer than the training \(epochs 3\)",
        ),
        (
            {
                "batch_scaling": "weak",
                "lr_warmup_epochs": 1,
                "epochs": 0,
                "data": "synthetic",
                "time_budget_s": 10,
            },
            "lr_warmup_epochs 1 needs epochs",
        ),  # fmt: skip
        ({"target_accuracy": 0.9, "epochs": 0, "data": "synthetic"}, "needs epochs"),
        ({"target_accuracy": 90}, "target_accuracy: 90 is not allowed"),
        ({"evals_per_epoch": 4, "epochs": 0, "data": "synthetic"}, "evals_per_epoch 4 needs"),
        ({"batch_scaling": "strong"}, "allowed: fixed, weak"),
    ],
)
def test_bad_arms_are_refused_naming_the_field(fields, message):
    with pytest.raises(study.StudyConfigError, match=message):
        study.load_study({"groups": {"g": {"runs": [{"id": "a", **ACC, **fields}]}}})


def test_the_warm_up_rises_from_the_one_process_rate_to_the_scaled_one():
    spec = {"lr": 0.04, "batch_scaling": "weak", "lr_warmup_epochs": 0.5}
    # 4 ranks: from 0.01, 10 steps of warm-up (half of a 20-step epoch)
    rates = [schedule.learning_rate(spec, 4, k, 20) for k in range(12)]
    assert rates[0] == pytest.approx(0.01) and rates[5] == pytest.approx(0.025)
    assert rates[10:] == [0.04, 0.04]
    assert all(a < b for a, b in zip(rates[:10], rates[1:11], strict=True))
    # no warm-up, or one rank: the rate as the spec holds it from the first step
    assert schedule.learning_rate({**spec, "lr_warmup_epochs": 0}, 4, 0, 20) == 0.04
    assert schedule.learning_rate(spec, 1, 0, 20) == 0.04
    assert schedule.one_process_lr({"lr": 0.04, "batch_scaling": "fixed"}, 4) == 0.04


def test_scoring_points_and_the_time_to_a_target():
    assert schedule.eval_points({"epochs": 2, "evals_per_epoch": 1}, 44) == [44, 88]
    assert schedule.eval_points({"epochs": 2, "evals_per_epoch": 4}, 10) == [
        2, 5, 8, 10, 12, 15, 18, 20
    ]  # fmt: skip
    curve = [
        {"train_time_s": 1.0, "test_accuracy": 0.5},
        {"train_time_s": 2.0, "test_accuracy": 0.91},
        {"train_time_s": 3.0, "test_accuracy": 0.89},  # reached once: the first counts
    ]
    assert schedule.time_to_accuracy(curve, 0.9) == 2.0
    assert schedule.time_to_accuracy(curve, 0.95) is None  # never reached
    assert schedule.time_to_accuracy(curve, None) is None  # no target


def test_a_warm_up_ends_short_where_its_steps_took_long_enough():
    """Without a time budget every warm-up step runs; with one, a run that compiles
    nothing in its steps stops warming up once its steps took a quarter of the budget,
    one that does (torch.compile, XLA, TorchScript) once they took all of it; a compiled
    training with dropout warms up two steps at least (its second compiles again)."""
    eager = {"backend": "eager", "compile": "none", "warmup_steps": 2, "time_budget_s": 120}
    assert schedule.warmup_enough_s(eager) == 30.0
    assert schedule.warmup_enough_s({**eager, "time_budget_s": None}) is None
    assert schedule.warmup_ends_after({**eager, "time_budget_s": None}, 500.0) == 2
    # an emulated bf16 ResNet-50 step (41-61 s on 2 AVX2 cores): one warm-up step
    assert schedule.warmup_ends_after(eager, 41.0) == 1
    assert schedule.warmup_ends_after(eager, 29.0) == 2  # (29 s < 30 s: a second)
    assert schedule.warmup_ends_after(eager, 3.7) == 2  # (never more than warmup_steps)
    for compiling in ({"compile": "inductor"}, {"backend": "xla"},
                      {"backend": "ipex", "ipex_torchscript": True}):  # fmt: skip
        spec = {**eager, **compiling}
        assert schedule.compiles_in_steps(spec), spec
        assert schedule.warmup_enough_s(spec) == 120.0
        assert schedule.warmup_ends_after(spec, 61.0) == 2
        assert schedule.warmup_ends_after(spec, 130.0) == 1
    assert not schedule.compiles_in_steps({**eager, "backend": "ipex"})
    redrop = {**eager, "compile": "inductor", "dropout": True, "mode": "train"}
    assert schedule.least_warmup(redrop) == 2 and schedule.warmup_ends_after(redrop, 500.0) == 2
    assert schedule.least_warmup({**redrop, "mode": "inference"}) == 1
