"""Measure until known, then stop (no torch): the adaptive rounds' plan
(workflow_scripts/plan/rounds.py), what a trial stops early against (plan/far.py) and the
rank's far-from-baseline rule (metrics.py), on the real config loader."""

from __future__ import annotations

import csv
import json
import statistics

import pytest

from workflow_scripts import metrics
from workflow_scripts.plan import far, rounds
from workflow_scripts.report.uncertainty import COLUMNS
from workflow_scripts.spec.settings import budget_seconds
from workflow_scripts.study import load_study, read_config


def study_of(**settings):
    config = {
        "defaults": {"model": "cnn", "image_size": 32, "batch_size": 8, "far_stop": 1.5},
        "groups": {
            "ladder": {
                "runs": [
                    {"id": "base"},
                    {"id": "bf16", "precision": "bf16"},
                    {"id": "big", "batch_size": 16},
                    {"id": "nofar", "far_stop": None},
                    {"id": "big-bf16", "batch_size": 16, "precision": "bf16"},
                    {"id": "tcmalloc", "launcher": "run_cpu", "allocator": "tcmalloc"},
                ]
            },
            "accuracy": {
                "shared": {"epochs": 1, "data": "digits"},
                "runs": [{"id": "acc"}, {"id": "acc-bf16", "precision": "bf16"}],
            },
        },  # fmt: skip
        **settings,
    }
    return load_study(config)


def test_the_cap_is_max_trials_above_trials():
    assert rounds.cap({"trials": 2, "max_trials": 4}) == 4
    assert rounds.cap({"trials": 2, "max_trials": None}) == 2
    assert rounds.cap({"trials": 5, "max_trials": 4}) == 5  # not above: no rounds
    assert rounds.adaptive({"trials": 2, "max_trials": 3})
    assert not rounds.adaptive({"trials": 1, "max_trials": 1})
    # one trial each decides nothing: trials 1 means one trial, whatever the cap
    assert rounds.cap({"trials": 1, "max_trials": 4}) == 1
    st = study_of(trials=2, max_trials=4)
    assert (st.settings["trials"], st.settings["max_trials"]) == (2, 4)
    n = len(st.experiments)
    assert (n * st.settings["trials"], n * rounds.cap(st.settings)) == (16, 32)


def test_the_default_study_is_adaptive_and_its_quick_preset_and_preflight_are_not():
    default = load_study(read_config("config.yaml"))
    assert rounds.adaptive(default.settings)
    quick = load_study(read_config("config.yaml", ["preset=quick"]))
    assert rounds.cap(quick.settings) == quick.settings["trials"] == 1
    preflight = load_study(read_config("config.yaml", ["preflight=true"]))
    assert rounds.cap(preflight.settings) == 1


def test_max_trials_is_checked_like_trials():
    with pytest.raises(Exception, match="max_trials"):
        study_of(max_trials=0)
    with pytest.raises(Exception, match="max_trials"):
        study_of(max_trials="four")


def write_comparisons(path, rows):
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        for baseline, experiment, verdict, *more in rows:
            w.writerow({"kind": "step", "baseline": baseline, "experiment": experiment,
                        "verdict": verdict, **(more[0] if more else {})})  # fmt: skip
    return path


def test_the_headlines_comparisons_go_on_until_their_interval_is_within_the_margin(tmp_path):
    wide = {"ratio": 2.0, "ci_low": 1.88, "ci_high": 2.13, "margin": 0.03}  # about ±6 %
    narrow = {"ratio": 1.5, "ci_low": 1.47, "ci_high": 1.53, "margin": 0.03}  # ±2 %
    table = write_comparisons(
        tmp_path / "comparisons.csv",
        [
            ("base", "best", "faster", {**wide, "headline": True}),  # the answer: not yet
            ("base", "bf16", "faster", {**narrow, "headline": True}),  # known well enough
            ("base", "other", "faster", {**wide, "headline": False}),  # decided: stops
            ("gpt2", "gpt2-fast", "faster", {**wide, "margin": 0.1, "headline": True}),
        ],
    )
    ran = ["base", "best", "bf16", "other", "gpt2", "gpt2-fast"]
    assert rounds.going_on(table, ran) == ["base", "best"]


def test_another_round_runs_exactly_what_an_undecided_comparison_names(tmp_path):
    table = write_comparisons(
        tmp_path / "comparisons.csv",
        [
            ("base", "bf16", "faster"),
            ("base", "twin", "undecided"),
            ("bf16", "bf16-cl", "same"),
            ("bf16-cl", "compiled", "undecided"),
            ("base", "one-thread", "slower"),
        ],
    )
    ran = ["base", "bf16", "bf16-cl", "compiled", "one-thread", "twin", "lonely"]
    assert rounds.going_on(table, ran) == ["base", "bf16-cl", "compiled", "twin"]
    # only those that ran the round just ended go on
    assert rounds.going_on(table, ["bf16-cl", "twin"]) == ["bf16-cl", "twin"]
    assert rounds.going_on(write_comparisons(tmp_path / "none.csv", []), ran) == []


#: an undecided comparison after the minimum's 2 trials each (look 1 of 3: 99.64 %)
LOOK_1 = {"n_baseline": 2, "n_experiment": 2, "margin": 0.03, "confidence": 1 - 0.05 / 14}
ADAPTIVE = {"trials": 2, "max_trials": 4, "futility": 0.1}


def test_an_undecided_comparison_goes_on_only_while_a_verdict_by_the_cap_is_in_reach(
    tmp_path,
):
    # 1 % apart at 9 % between trials: neither "the same" within ±3 % nor faster at 4
    # trials; 12 % apart at 5 %: faster within reach
    hopeless = {**LOOK_1, "ratio": 1.01, "spread": 0.09, "df": 8}
    promising = {**LOOK_1, "ratio": 1.12, "spread": 0.05, "df": 8}
    table = write_comparisons(
        tmp_path / "comparisons.csv",
        [("base", "twin", "undecided", hopeless), ("base", "fast", "undecided", promising)],
    )
    ran = ["base", "twin", "fast"]
    ahead = (rounds.cap(ADAPTIVE), rounds.looks(ADAPTIVE), rounds.look_of(1, ADAPTIVE))
    assert ahead == (4, 3, 1)
    assert (
        rounds.decision_chance(hopeless, *ahead) < 0.1 < rounds.decision_chance(promising, *ahead)
    )
    assert rounds.going_on(table, ran, ADAPTIVE, 1) == ["base", "fast"]
    # futility 0, or no settings: every undecided comparison goes on, as before
    assert rounds.going_on(table, ran, {**ADAPTIVE, "futility": 0}, 1) == ran
    assert rounds.going_on(table, ran) == ran
    # a higher cap brings the verdict within reach
    chances = [rounds.decision_chance(hopeless, cap, 3, 1) for cap in (4, 10, 40)]
    assert chances == sorted(chances) and chances[-1] > 0.3, chances
    # no trial to come: decided now or never; a row without a spread: as before
    assert rounds.decision_chance(hopeless, 2, 1, 1) == 0.0
    assert rounds.decision_chance({**hopeless, "spread": "nan"}, *ahead) == 1.0
    assert rounds.decision_chance({**hopeless, "df": 0}, *ahead) == 1.0


@pytest.mark.parametrize("ratio", [0.96, 1.0, 1.05, 1.09])
def test_the_decision_chance_is_the_share_of_simulated_futures_that_decide(ratio):
    """Futures drawn as the chance assumes (each side's true mean from today's mean and
    its error, then the trials to come), scored by the report's own verdict at the last
    look's confidence: the share decided is the chance computed."""
    import numpy as np
    import scipy.stats

    from workflow_scripts.report.uncertainty import verdict

    row = {**LOOK_1, "ratio": ratio, "spread": 0.03, "df": 10}
    rng = np.random.default_rng(7)
    draws, s, n, big = 40_000, 0.03, 2, 4
    x = np.log(ratio)
    truth = x + rng.normal(0, s * np.sqrt(2 / n), draws)  # (the baseline's mean at 0)
    future = truth + rng.normal(0, s * np.sqrt(2 / (big - n)), draws)
    last = (n * x + (big - n) * future) / big
    alpha = (1 - row["confidence"]) * rounds.spent(3, 3) / rounds.spent(1, 3)
    half = scipy.stats.t.ppf(1 - alpha / 2, 10 + 2 * (big - n)) * s * np.sqrt(2 / big)
    decided = np.mean([verdict(np.exp(v - half), np.exp(v + half)) != "undecided" for v in last])
    assert abs(rounds.decision_chance(row, big, 3, 1) - decided) < 0.01, decided


def test_futility_is_checked_like_the_margin():
    assert study_of().settings["futility"] == 0.1
    assert study_of(futility=0).settings["futility"] == 0
    for bad in (1, -0.1, "often"):
        with pytest.raises(Exception, match="futility"):
            study_of(futility=bad)


def test_a_trial_stops_early_against_the_first_run_of_its_group_doing_the_same_work():
    st = study_of()
    specs = st.experiments
    by_id = st.by_id
    assert far.baseline_of(by_id["bf16"], specs) == "base"
    assert far.baseline_of(by_id["base"], specs) is None  # the group's first itself
    assert far.baseline_of(by_id["acc-bf16"], specs) is None  # epochs: never cut short
    assert far.baseline_of(by_id["nofar"], specs) is None  # far_stop null
    # another batch is other work: the first earlier run at that batch
    assert far.baseline_of(by_id["big"], specs) is None
    assert far.baseline_of(by_id["big-bf16"], specs) == "big"
    assert not far.same_work(by_id["big-bf16"], by_id["base"])
    # a launcher (and its allocator) runs the same step faster or slower
    assert far.baseline_of(by_id["tcmalloc"], specs) == "base"
    assert far.same_work(by_id["bf16"], by_id["base"])
    assert not far.same_work(by_id["big"], by_id["base"])
    assert not far.same_work(by_id["acc"], by_id["acc-bf16"])
    # a trial's input is its own pointer, whatever the other runs' settings: every run
    # but its group's first, an epochs run and one with far_stop off
    pointed = [e["id"] for e in specs if far.has_pointer(e, specs)]
    assert pointed == ["bf16", "big", "big-bf16", "tcmalloc"]


def test_a_trial_follows_its_far_pointer_to_its_baselines_first_trial(tmp_path):
    spec = {"id": "bf16", "far_stop": 1.5}
    record = tmp_path / "records/base/trial0.json"
    record.parent.mkdir(parents=True)
    record.write_text(
        '{"status": "ok", "trial": 0, "spec": {"id": "base"},'
        ' "metrics": {"step_time_s": {"median": 0.25}}}'
    )
    pointer, log = tmp_path / "far/bf16.json", tmp_path / "logs/far/bf16.log"
    far.write_pointer(pointer, "bf16", "base", str(record), log)
    assert json.loads(pointer.read_text())["record"] == "../records/base/trial0.json"
    assert "base's first trial" in log.read_text()
    assert far.reference(pointer, spec)["step_time_s"] == 0.25
    # none: no early stop, and the log says why
    far.write_pointer(pointer, "bf16", "", None, log)
    assert far.reference(pointer, spec) is None
    assert "no earlier run of its group" in log.read_text()


def test_far_is_beyond_the_factor_either_way_with_the_whole_interval():
    ref = {"step_time_s": 1.0, "factor": 1.5}
    # one step has no interval: far only where slower by the factor squared (2.25x)
    assert metrics.far_beyond(ref, [3.0]) and not metrics.far_beyond(ref, [2.0])
    assert not metrics.far_beyond(ref, [0.1])  # a faster run costs less: no 1-step stop
    assert not metrics.far_beyond(ref, [])
    assert metrics.far_beyond(ref, [3.0, 3.1])  # two that agree: 1 df, yet ~3x slower
    assert not metrics.far_beyond(ref, [2.0, 3.0])  # two that do not: t(1) = 12.7
    assert metrics.far_beyond(ref, [3.0, 3.1, 2.9])  # ~3x slower
    assert metrics.far_beyond(ref, [0.5, 0.52, 0.49])  # ~2x faster
    assert not metrics.far_beyond(ref, [1.2, 1.1, 1.3])  # near
    # the mean is 1.8x slower, but its interval reaches below the factor: not yet
    noisy = [0.9, 2.7, 1.8]
    assert statistics.fmean(noisy) > 1.5 and not metrics.far_beyond(ref, noisy)
    assert not metrics.far_beyond(None, [3.0, 3.0, 3.0])


def test_the_reference_is_an_ok_first_trials_median_step(tmp_path):
    spec = {"id": "bf16", "far_stop": 1.5}
    ok = tmp_path / "ok.json"
    ok.write_text(
        '{"status": "ok", "trial": 0, "spec": {"id": "base"},'
        ' "metrics": {"step_time_s": {"median": 0.25}}}'
    )
    assert far.reference(ok, spec) == {
        "baseline": "base", "trial": 0, "step_time_s": 0.25, "factor": 1.5,
    }  # fmt: skip
    failed = tmp_path / "failed.json"
    failed.write_text('{"status": "failed", "metrics": {}}')
    assert far.reference(failed, spec) is None
    assert far.reference(tmp_path / "missing.json", spec) is None
    assert far.reference(ok, {"id": "bf16", "far_stop": None}) is None
    assert far.reference(ok, {"id": "big", "far_stop": 1.5, "batch_size": 16}) is None


def test_a_budget_reads_as_a_duration():
    assert budget_seconds("1h") == 3600.0
    assert budget_seconds("90min") == budget_seconds("90m") == 5400.0
    assert budget_seconds("1.5h") == 5400.0 and budget_seconds("45s") == 45.0
    for bad in ("1 h", "h", "-1h", "1h\n", "1d", ""):
        with pytest.raises(ValueError, match="no duration"):
            budget_seconds(bad)


def test_the_rounds_that_fit_are_the_worst_cases():
    # 10 min of setup, 20 min a round (every experiment once)
    # the minimum's 2 rounds cost 2400 s, each further round 1200 s
    assert rounds.rounds_within(3600, 600, 2400, 1200, 2, 4) == 2
    assert rounds.rounds_within(7200, 600, 2400, 1200, 2, 4) == 4  # 5 fit; the cap is 4
    assert rounds.rounds_within(6000, 600, 2400, 1200, 2, 4) == 4
    assert rounds.rounds_within(3000, 600, 2400, 1200, 2, 4) == 2
    assert rounds.rounds_within(2900, 600, 2400, 1200, 2, 4) is None  # not even the minimum
    # fewer go on than ran the minimum (far runs, seed sweeps): more rounds fit
    assert rounds.rounds_within(3600, 600, 2400, 300, 2, 8) == 4


def test_what_a_number_of_trials_buys_is_students_t_over_the_pooled_spread():
    import math

    import scipy.stats

    hw = rounds.half_width(3, 10, 0.05)
    assert hw == pytest.approx(scipy.stats.t.ppf(0.975, 20) * 0.05 * math.sqrt(2 / 3))
    assert math.isinf(rounds.half_width(1, 10, 0.05))
    text = rounds.precision_text(2, 40, 0.05, "assumed", 0.03)
    expected = 100 * math.expm1(rounds.half_width(2, 40, 0.05))
    assert text.startswith(
        f"with 2 trials each a comparison's 95 % interval is about ±{expected:.0f} %"
    )
    assert "'the same' within ±3 % needs about" in text
    assert "nothing is decided" in rounds.precision_text(1, 40, 0.05, "assumed", 0.03)


def test_a_seed_sweeps_seeds_are_its_replicates():
    config = {
        "defaults": {"model": "cnn", "image_size": 32, "epochs": 1, "data": "digits"},
        "groups": {
            "accuracy": {
                "runs": [
                    {"id": "one-seed", "seed": 4, "lr": 0.2},
                    {"name": "acc", "seed": [0, 1, 2], "precision": ["fp32", "bf16"]},
                    {"name": "pair", "seed": [0, 1], "lr": 0.01},
                ]
            }
        },  # fmt: skip
    }
    st = load_study(config)
    first = rounds.first_trials(st.experiments, 2)
    # 3 seeds of one configuration: one trial each is 3 of it; 2 seeds: one each
    assert {first[e] for e in st.ids if e.startswith("acc-")} == {1}
    assert {first[e] for e in st.ids if e.startswith("pair-")} == {1}
    assert first["one-seed"] == 2  # a seed of its own: the study's trials
    assert set(rounds.first_trials(st.experiments, 4).values()) == {2, 4}
    assert set(rounds.first_trials(study_of().experiments, 2).values()) == {2}


def test_a_first_trial_far_from_its_baseline_is_its_last(tmp_path):
    def record(experiment, status="ok", stop="far_from_baseline", step=40.0, factor=1.5):
        folder = tmp_path / experiment
        folder.mkdir()
        metrics = {"stop_reason": stop, "step_time_s": {"median": step}}
        far_from = {"step_time_s": 1.0} | ({"factor": factor} if factor else {})
        body = {"status": status, "metrics": metrics, "far_from": far_from}
        (folder / "trial0.json").write_text(json.dumps(body))

    record("bf16")  # 40x slower than its baseline
    record("near", stop="precision")
    record("failed", status="error")
    # far faster: it costs less than its baseline, and may be the answer: its trials run
    record("fast", step=0.4)
    # beyond 1.5x but not its square: a neighbour's load may do that to one process
    # (twins of identical settings ran 1.56x and 1.85x slower): its second trial runs
    record("disturbed", step=1.85)
    record("squared", step=2.3)
    record("unsaid", factor=None)  # no factor in the record: nothing to square
    (tmp_path / "torn").mkdir()
    (tmp_path / "torn" / "trial0.json").write_text("{")
    names = ["bf16", "near", "failed", "fast", "disturbed", "squared", "unsaid", "torn", "x"]
    assert rounds.stopped_far(tmp_path, names) == {"bf16", "squared"}
    assert rounds.far_first(tmp_path, "disturbed") == (1.85, 1.5)
    assert rounds.far_first(tmp_path, "fast") == (0.4, 1.5)
    assert rounds.far_first(tmp_path, "near") is None


def test_a_far_stop_within_the_margin_settles_nothing():
    assert rounds.one_trial_when_far({"far_stop": 1.5}, 0.03)
    assert not rounds.one_trial_when_far({"far_stop": 1.25}, 0.3)  # beyond 1.25 is not 1.3
    assert not rounds.one_trial_when_far({"far_stop": None}, 0.03)


def test_the_budgets_clock_leaves_out_what_would_end_past_it(tmp_path, monkeypatch):
    """plan/clock.py: the deadline is the start plus the budget; a trial that would end
    past it does not start; the next run forgets exactly the records it left out."""
    from workflow_scripts.plan import clock

    monkeypatch.setenv(clock.DEADLINE_VAR, "")  # (restored after the test: start() sets it)
    monkeypatch.delenv(clock.DEADLINE_VAR)
    monkeypatch.delenv(clock.AFTER_VAR, raising=False)  # (nothing kept after the trials)
    monkeypatch.delenv(clock.LEAST_VAR, raising=False)
    assert clock.deadline() is None and not clock.too_late(1e9)  # no budget: no clock
    until = clock.start(3600, now=1000.0)
    assert until == 4600.0 and clock.deadline() == 4600.0
    assert not clock.too_late(600, now=2000.0) and clock.too_late(600, now=4100.0)
    assert clock.too_late(0, now=4600.5) and not clock.too_late(-5, now=4599.0)
    assert "the budget's clock ran out" in clock.why(600, until)
    for name, status in (("a", "ok"), ("b", clock.LEFT_OUT), ("c", "failed")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "trial0.json").write_text(json.dumps({"status": status}))
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "trial1.json").write_text("{not json")
    summary = tmp_path / "summary.csv"
    summary.write_text("experiment\n")
    assert clock.forget(tmp_path, summary) == [tmp_path / "b" / "trial0.json"]
    assert sorted(p.parent.name for p in tmp_path.glob("*/trial*.json")) == ["a", "c", "d"]
    assert not summary.exists()  # (the report runs again, and so the trials it lacks)
    summary.write_text("experiment\n")
    assert clock.forget(tmp_path, summary) == [] and summary.exists()  # nothing left out


def test_the_clock_keeps_time_for_what_runs_after_the_last_trial(tmp_path, monkeypatch):
    """A trial starts only where it and what the study runs after its last trial (the
    collectives jobs, the report) end by the deadline, both scaled as the study's trials
    so far took against their own estimates (a budget=1h default study ran its last trial
    up to the deadline and its collectives and report 2.6 min past it)."""
    from workflow_scripts.plan import clock

    monkeypatch.setenv(clock.DEADLINE_VAR, "")
    monkeypatch.setenv(clock.AFTER_VAR, "")
    monkeypatch.setenv(clock.LEAST_VAR, "")
    assert clock.after() == clock.least() == clock.kept(2.0) == 0.0  # none kept: unreadable
    clock.keep_after(150.0)
    until = clock.start(3600, now=1000.0)
    assert clock.after() == 150.0 and clock.least() == 0.0
    # 60 s of trial and 150 s kept: from 4390 on it would end past 4600
    assert not clock.too_late(60, now=4390.0) and clock.too_late(60, now=4391.0)
    assert not clock.too_late(60, now=4539.0, after_s=0)  # (the trial alone)
    # at x 1.3: (60 + 150) x 1.3 = 273 s
    assert clock.kept(1.3) == pytest.approx(195.0)
    assert not clock.too_late(60, now=4327.0, scale=1.3)
    assert clock.too_late(60, now=4328.0, scale=1.3)
    said = clock.why(60, until, clock.kept(1.3), 1.3)
    assert (
        "about 60 s by the estimate, x 1.30 as this study's trials took against their "
        "estimates, and the 195 s kept for what the study runs after its trials" in said
    )
    assert "x 1." not in clock.why(60, until, 150.0, 1.0)
    # at least the least kept, whatever the scale: 200 s against 150 x 1.3 = 195, not
    # 200 x 1.3 (the least is the most the jobs after the trials took: scaled again, a
    # budget=1h default study kept 7.2 min for 3 min of them and left out 4 trials)
    clock.keep_after(150.0, least=200.0)
    assert clock.kept(1.3) == 200.0 and clock.kept(2.0) == 300.0 and clock.kept(0.5) == 200.0
    assert not clock.too_late(60, now=4322.0, scale=1.3)  # 78 + 200 = 278 s
    assert clock.too_late(60, now=4323.0, scale=1.3)
    clock.keep_after(-5, least=-1)
    assert clock.after() == clock.least() == 0.0
    # the ratio: the records that ended ok, each's wall without its noise reruns over its
    # own estimate; a failed one, one without an estimate and a torn one say nothing
    records = tmp_path / "records"
    assert clock.ratio(records) == 1.0  # none yet
    rows = {
        "a": {"status": "ok", "trial_wall_s": 30.0, "estimate": {"seconds": 20.0}},
        "b": {"status": "ok", "trial_wall_s": 50.0, "retry_wall_s": 20.0,
              "estimate": {"seconds": 20.0}},
        "c": {"status": "failed", "trial_wall_s": 1.0, "estimate": {"seconds": 100.0}},
        "d": {"status": "ok", "trial_wall_s": 9.0, "estimate": None},
    }  # fmt: skip
    for name, record in rows.items():
        (records / name).mkdir(parents=True)
        (records / name / "trial0.json").write_text(json.dumps(record))
    (records / "e").mkdir()
    (records / "e" / "trial1.json").write_text("{torn")
    assert clock.ratio(records) == pytest.approx(60.0 / 40.0)
    (records / "a" / "trial1.json").write_text(json.dumps(
        {"status": "ok", "trial_wall_s": 1e6, "estimate": {"seconds": 1.0}}))  # fmt: skip
    assert clock.ratio(records) == clock.RATIO_BOUNDS[1]


def test_a_budget_keeps_the_collectives_and_the_report_after_its_trials(tmp_path):
    """What the plan keeps after the last trial: each collectives job without a result,
    at the estimate's and, the least kept, at the most one took on the machines measured,
    and a report of every experiment."""
    from workflow_scripts.plan import estimate
    from workflow_scripts.study import entry

    class Study:
        settings = {"collectives": {"variants": ["gloo", "ccl-shm"]}}
        experiments = [{"id": f"e{i}"} for i in range(10)]

    report = estimate.report_s(10)
    both = entry.after_last_trial(Study, tmp_path)
    assert both == pytest.approx(
        (2 * estimate.COLLECTIVES_S + report, 2 * estimate.COLLECTIVES_MOST_S + report)
    )
    (tmp_path / "collectives").mkdir()
    (tmp_path / "collectives" / "gloo.json").write_text("{}")
    assert entry.after_last_trial(Study, tmp_path) == pytest.approx(
        (estimate.COLLECTIVES_S + report, estimate.COLLECTIVES_MOST_S + report)
    )
    Study.settings = {"collectives": {"variants": []}}
    assert entry.after_last_trial(Study, tmp_path) == pytest.approx((report, report))


def test_only_a_run_that_runs_jobs_forgets_left_out_trials():
    from workflow_scripts.study import runs_jobs

    assert runs_jobs(["snakemake", "--cores", "all", "--config", "budget=1h"])
    assert runs_jobs(["snakemake", "-c2", "--configfile", "n.yaml"])
    for dry in (["-n"], ["-np"], ["--dry-run"], ["--dryrun"], ["--lint"], ["--dag"],
                ["--report", "r.html"], ["--summary"], ["-t"], ["--unlock"]):  # fmt: skip
        assert not runs_jobs(["snakemake", "--cores", "2", *dry]), dry
