"""The order a round runs its experiments in: the question first (plan/order.py)."""

from __future__ import annotations

from pathlib import Path

from workflow_scripts import study
from workflow_scripts.plan import order, study_estimate

REPO = Path(__file__).resolve().parents[1]


def small_study() -> study.Study:
    config = {
        "defaults": {"model": "cnn", "image_size": 32, "batch_size": 8, "steps": 4},
        "groups": {
            "ladder": {"runs": [{"id": "base"}, {"id": "bf16", "precision": "bf16"}]},
            "other": {
                "runs": [
                    {"id": "o-base"},
                    {"id": "o-bf16", "precision": "bf16"},  # the same work: its ladder
                    {"name": "o-batch", "batch_size": [4, 16]},  # other work: the rest
                ]
            },
            "acc": {
                "shared": {"data": "digits", "epochs": 1},
                "runs": [{"name": "acc", "seed": [0, 1]}],  # an epochs run's seeds
            },
        },
    }
    return study.load_study(config)


def test_the_headline_group_then_each_groups_baseline_then_ladders_then_the_rest():
    s = small_study()
    tiers = order.tiers(s.experiments)
    assert tiers == {
        "base": order.HEADLINE, "bf16": order.HEADLINE,
        "o-base": order.BASELINES, "o-bf16": order.LADDERS,
        "o-batch-bs4": order.REST, "o-batch-bs16": order.REST,
        "acc-seed0": order.BASELINES, "acc-seed1": order.REST,
    }  # fmt: skip
    assert order.question(s.experiments) == ["base", "bf16", "o-base", "acc-seed0"]
    families = ["base", "bf16", "o-base", "o-bf16", "acc-seed0"]
    assert order.stages(s.experiments) == {"first": ["base", "bf16"], "families": families}
    # two trials each: the headline's second ones right after its first, reported apart
    assert order.stages(s.experiments, trials=2) == {
        "first": ["base", "bf16"], "headline": ["base", "bf16"], "families": families
    }  # fmt: skip
    assert [order.headline_trials(n, 3) for n in ("first", "headline", "families")] == [1, 2, 2]
    assert order.headline_trials("families", 1) == 1
    # within a tier past the question: the cheapest first; the order written breaks ties
    seconds = {"o-batch-bs4": 30.0, "o-batch-bs16": 10.0, "acc-seed1": 10.0, "o-bf16": 99.0}
    assert order.run_order(s.experiments, seconds) == [
        "base", "bf16", "o-base", "acc-seed0", "o-bf16", "o-batch-bs16", "acc-seed1",
        "o-batch-bs4",
    ]  # fmt: skip
    # no estimate: tiers, then the order written
    assert order.run_order(s.experiments, {})[4:] == [
        "o-bf16", "o-batch-bs4", "o-batch-bs16", "acc-seed1"
    ]  # fmt: skip


def test_the_default_study_asks_its_question_first():
    s = study.load_study(study.read_config(REPO / "config.yaml"))
    question = order.question(s.experiments)
    ladder = [e["id"] for e in s.experiments if e["group"] == "ladder"]
    assert question[: len(ladder)] == ladder and question[0] == "baseline"
    groups = list(dict.fromkeys(e["group"] for e in s.experiments))
    firsts = [next(e["id"] for e in s.experiments if e["group"] == g) for g in groups[1:]]
    assert question[len(ladder) :] == firsts
    assert {"bert-base", "infer-resnet50-bs1-fp32", "ddp-gloo-r1-t2"} <= set(question)
    tiers = order.tiers(s.experiments)
    # the transformer ladder's rungs come next; no accuracy seed before them
    assert tiers["bert-base-bf16"] == tiers["infer-resnet50-bs1-bf16"] == order.LADDERS
    assert all(tiers[e["id"]] in (order.BASELINES, order.REST)
               for e in s.experiments if e.get("epochs"))  # fmt: skip
    seconds = study_estimate.trial_seconds(s)
    assert set(seconds) == set(s.ids) and all(v > 0 for v in seconds.values())
    run = order.run_order(s.experiments, seconds)
    assert sorted(run) == sorted(s.ids) and run[: len(question)] == question


def test_a_stage_that_adds_nothing_or_holds_everything_is_left_out():
    one_group = study.load_study(
        {"groups": {"g": {"runs": [{"id": "a"}, {"id": "b", "threads": 1}]}}}
    )
    assert order.stages(one_group.experiments) == {}  # the report is its only report
    two = study.load_study({"groups": {"g": {"runs": [{"id": "a"}]},
                                       "h": {"runs": [{"id": "b"}]}}})  # fmt: skip
    assert order.stages(two.experiments) == {"first": ["a"]}  # families: the whole study
    assert order.stages(two.experiments, trials=2) == {"first": ["a"], "headline": ["a"]}
    assert order.stages(one_group.experiments, trials=2) == {}
