"""The progress line after every trial: trials done of all, elapsed, and the time left
from the estimate scaled by what the trials done so far measured against theirs."""

from __future__ import annotations

import json
import os
import re
import statistics

import pytest

from tests.estimates import calibration, machine
from workflow_scripts import study
from workflow_scripts.plan import (
    estimate,
    estimate_text,
    forecast,
    order,
    progress,
    rounds,
    study_estimate,
)
from workflow_scripts.plan.study_estimate import Known, Setup


def small_study(trials: int = 2) -> study.Study:
    config = {
        "trials": trials,
        "defaults": {"model": "cnn", "image_size": 32, "batch_size": 8, "steps": 20},
        "groups": {"g": {"runs": [{"id": "a"}, {"id": "b", "precision": "bf16"}, {"id": "c"}]}},
    }
    return study.load_study(config)


def predicted_study():
    """The small study, the machine it is estimated on and each experiment's estimate."""
    s, m = small_study(), machine(calibration())
    return s, m, study_estimate.total(s.experiments, 2, m, Setup(s.envs))["experiments"]


def write_record(results, exp: str, trial: int, wall: float | None, **more) -> None:
    path = results / "records" / exp / f"trial{trial}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    # the record's own estimate (the trial's, from the calibration alone) is not used
    record = {"status": "ok", "trial_wall_s": wall, "estimate": {"seconds": 1e6}, **more}
    path.write_text(json.dumps(record))


def test_nothing_done_yet_says_the_estimate(tmp_path):
    s = small_study()
    m = machine(calibration())
    text = progress.line(s, tmp_path, started=100.0, now=160.0, machine=m)
    assert text.startswith("[progress] 0 of 6 trials have a record, 60 s elapsed in this run")
    left = study_estimate.total(s.experiments, 2, m, Setup(s.envs))["remaining_trials_s"]
    after, jobs, *_ = progress.after_trials(s, tmp_path)
    assert jobs == len(s.settings["collectives"]["variants"]) > 0
    assert f"about {estimate_text.human(left + after)} left (the estimate, nothing measured" in text
    assert f"then about {estimate_text.human(after)} for the {jobs} collectives jobs and" in text


def test_the_time_left_is_scaled_by_what_was_measured(tmp_path):
    s, m, predicted = predicted_study()
    # the two trials done took twice what the same estimate predicts for them
    write_record(tmp_path, "a", 0, wall=2 * predicted["a"]["seconds"])
    write_record(tmp_path, "b", 0, wall=2 * predicted["b"]["seconds"])
    text = progress.line(s, tmp_path, started=0.0, now=7200.0, machine=m)
    done = [("a", 0), ("b", 0)]
    left = study_estimate.total(s.experiments, 2, m, Setup(s.envs), Known(done))[
        "remaining_trials_s"
    ]
    assert text.startswith("[progress] 2 of 6 trials have a record, 2.0 h elapsed")
    # the collectives jobs not yet run at the same ratio (the reports at their own)
    after, jobs, *_ = progress.after_trials(s, tmp_path, scale=2.0)
    assert after - progress.after_trials(s, tmp_path).seconds == pytest.approx(
        jobs * estimate.COLLECTIVES_S
    )
    assert f"about {estimate_text.human(2 * left + after)} left" in text
    assert "for the 4 trials without a record, x 2.00: measured/estimated so far" in text
    # a record without a wall time counts as done, not in the ratio
    write_record(tmp_path, "c", 0, wall=None)
    again = progress.line(s, tmp_path, started=0.0, now=7200.0, machine=m)
    assert again.startswith("[progress] 3 of 6") and "x 2.00" in again
    # an estimate 100x off is bounded
    write_record(tmp_path, "a", 1, wall=1000 * predicted["a"]["seconds"])
    bounded = progress.line(s, tmp_path, started=0.0, now=7200.0, machine=m)
    ratio = float(re.search(r"x (\d+\.\d+): measured", bounded).group(1))
    assert ratio == progress.RATIO_BOUNDS[1]


def test_a_trials_noise_reruns_are_not_extrapolated(tmp_path):
    s, m, predicted = predicted_study()
    # a trial run three times (two attempts discarded as disturbed) took 3x its estimate,
    # of which 2x were the reruns: the time left is scaled by 1.00, not 3
    a = predicted["a"]["seconds"]
    write_record(tmp_path, "a", 0, wall=3 * a, retry_wall_s=2 * a)
    write_record(tmp_path, "b", 0, wall=predicted["b"]["seconds"])
    text = progress.line(s, tmp_path, started=0.0, now=600.0, machine=m)
    assert "x 1.00: measured/estimated so far, noise reruns left out" in text
    # they are added at this run's rate instead (their time over the kept trials' wall),
    # weighed by how many trials say: two of them, so 2 / (2 + 10) of that rate
    b = predicted["b"]["seconds"]
    share = 2 * a / (a + b) * 2 / (2 + progress.RERUN_PRIOR_TRIALS)
    assert f"and {100 * share:.0f}% more for noise reruns at this run's rate" in text, text
    done = [("a", 0), ("b", 0)]
    left = study_estimate.total(s.experiments, 2, m, Setup(s.envs), Known(done))
    after, *_ = progress.after_trials(s, tmp_path)
    guess = left["remaining_trials_s"] * (1 + share) + after
    assert f"about {estimate_text.human(guess)} left" in text, text
    # without reruns, nothing is added
    write_record(tmp_path, "a", 0, wall=a)
    quiet = progress.line(s, tmp_path, started=0.0, now=600.0, machine=m)
    assert "noise reruns left out;" in quiet and "more for noise reruns" not in quiet, quiet


def test_an_earlier_sittings_noise_reruns_are_not_this_runs_rate(tmp_path):
    s, m, predicted = predicted_study()
    a, b = predicted["a"]["seconds"], predicted["b"]["seconds"]
    # trial "a" was rerun for noise in an earlier sitting (its record written before this
    # run started); "b", written in this run, was not: nothing is added for reruns
    write_record(tmp_path, "a", 0, wall=3 * a, retry_wall_s=2 * a)
    write_record(tmp_path, "b", 0, wall=b)
    old = tmp_path / "records" / "a" / "trial0.json"
    os.utime(old, (1000.0, 1000.0))
    os.utime(tmp_path / "records" / "b" / "trial0.json", (3000.0, 3000.0))
    resumed = progress.line(s, tmp_path, started=2000.0, now=3600.0, machine=m)
    assert "x 1.00: measured/estimated so far, noise reruns left out;" in resumed, resumed
    assert "more for noise reruns" not in resumed, resumed
    # the same records, all written in this run: the reruns count at their rate
    os.utime(old, (3000.0, 3000.0))
    whole = progress.line(s, tmp_path, started=2000.0, now=3600.0, machine=m)
    share = 2 * a / (a + b) * 2 / (2 + progress.RERUN_PRIOR_TRIALS)
    assert f"and {100 * share:.0f}% more for noise reruns at this run's rate" in whole, whole


def test_a_trial_that_did_not_end_ok_is_not_extrapolated_and_predicts_its_repeats(tmp_path):
    s, m, predicted = predicted_study()
    a = predicted["a"]["seconds"]
    write_record(tmp_path, "a", 0, wall=2 * a)
    # b failed after 5 s (an instruction set this CPU lacks), where a whole trial was
    # predicted: the ratio is a's alone, and b's trial 1 is predicted at 5 s, not scaled
    assert predicted["b"]["seconds"] > 2 * 5.0
    write_record(tmp_path, "b", 0, wall=5.0, status="failed")
    text = progress.line(s, tmp_path, started=0.0, now=600.0, machine=m)
    assert "4 trials without a record, x 2.00: measured/estimated so far" in text, text
    done = [("a", 0), ("b", 0)]
    est = study_estimate.total(s.experiments, 2, m, Setup(s.envs), Known(done, failed={"b": 5.0}))
    assert est["experiments"]["b"]["later_seconds"] == 5.0 and est["remaining_repeats_s"] == 5.0
    after, *_ = progress.after_trials(s, tmp_path, scale=2.0)
    left = 2 * (est["remaining_trials_s"] - 5.0) + 5.0 + after
    assert f"about {estimate_text.human(left)} left" in text, text
    # the start-of-run estimate reads the same from the records
    assert study_estimate.failed_walls(tmp_path, s.experiments, 2) == {"b": 5.0}
    # b's trial 1 ran ok: its failure is no longer what its trials repeat
    b = predicted["b"]["later_seconds"]
    write_record(tmp_path, "b", 1, wall=b)
    assert study_estimate.failed_walls(tmp_path, s.experiments, 2) == {}
    again = progress.line(s, tmp_path, started=0.0, now=600.0, machine=m)
    assert f"3 trials without a record, x {(2 * a + b) / (a + b):.2f}" in again, again


def test_trials_that_disagree_give_a_range(tmp_path):
    s, m, predicted = predicted_study()
    write_record(tmp_path, "a", 0, wall=0.5 * predicted["a"]["seconds"])
    write_record(tmp_path, "b", 0, wall=3.0 * predicted["b"]["seconds"])
    text = progress.line(s, tmp_path, started=0.0, now=600.0, machine=m)
    found = re.search(r"about (\S+ \S+) left, (\S+ \S+) to (\S+ \S+) \(the estimate", text)
    assert found, text
    # two trials that agree: one figure
    write_record(tmp_path, "b", 0, wall=0.5 * predicted["b"]["seconds"])
    text = progress.line(s, tmp_path, started=0.0, now=600.0, machine=m)
    assert re.search(r"about \S+ \S+ left \(the estimate", text), text


def test_the_trials_left_are_at_their_groups_ratio_where_its_trials_say(tmp_path):
    """A tail of unlike trials is not scaled by the run's ratio: each trial left is at
    its group's (its trials' measured over estimated, drawn towards the run's as if the
    run's were one more of its trials), a group with none done at the run's."""
    config = {
        "trials": 2,
        "defaults": {"model": "cnn", "image_size": 32, "batch_size": 8, "steps": 20},
        "groups": {
            "fast": {"runs": [{"id": "a"}, {"id": "b", "batch_size": 16}]},
            "slow": {"runs": [{"id": "c", "precision": "bf16"}, {"id": "d", "steps": 30}]},
            "new": {"runs": [{"id": "e", "image_size": 64}]},
        },
    }
    s, m = study.load_study(config), machine(calibration())
    per = study_estimate.total(s.experiments, 2, m, Setup(s.envs))["experiments"]

    def est(e: str, k: int) -> float:
        return per[e]["seconds"] if k == 0 else per[e]["later_seconds"]

    # the fast group's two first trials at half their estimate, the slow group's one at twice
    done = {("a", 0): 0.5, ("b", 0): 0.5, ("c", 0): 2.0}
    for (e, k), r in done.items():
        write_record(tmp_path, e, k, wall=r * est(e, k))
    walls = {key: r * est(*key) for key, r in done.items()}
    run = sum(walls.values()) / sum(est(*key) for key in done)
    fast_est = est("a", 0) + est("b", 0)
    fast = (0.5 * fast_est + fast_est / 2 * run) / (fast_est + fast_est / 2)
    slow = (2.0 * est("c", 0) + est("c", 0) * run) / (2 * est("c", 0))
    assert fast < run < slow
    at = {"a": fast, "b": fast, "c": slow, "d": slow, "e": run}
    left = [(e, k) for e in "abcde" for k in range(2) if (e, k) not in done]
    ahead = sum(est(e, k) * at[e] for e, k in left)
    ratio = ahead / sum(est(e, k) for e, k in left)
    text = progress.line(s, tmp_path, started=0.0, now=600.0, machine=m)
    after, *_ = progress.after_trials(s, tmp_path)
    assert f"about {estimate_text.human(ahead + after)} left" in text, text
    assert f"x {ratio:.2f}: measured/estimated so far by group (the run's {run:.2f})" in text
    # the slow group's trials left outweigh the fast one's: more time left than at the run's
    assert ratio > run


def test_the_last_line_says_how_much_of_the_time_was_measuring(tmp_path):
    s = small_study(trials=1)
    # a 5 s step loop: a first step of 2 s, then 3 timed steps of 1 s (and a warm-up step)
    metrics = {"train_time_s": 5.0, "time_to_first_step_s": 2.0, "steps_timed": 3,
               "step_time_s": {"median": 1.0, "mean": 1.0}}  # fmt: skip
    write_record(tmp_path, "a", 0, wall=10.0, metrics=metrics)
    write_record(tmp_path, "b", 0, wall=10.0, metrics=metrics, retry_wall_s=5.0)
    # a record without its timed steps: its whole first step is left out (2 s of 4)
    write_record(tmp_path, "c", 0, wall=5.0, metrics={"train_time_s": 4.0,
                                                      "time_to_first_step_s": 2.0})  # fmt: skip
    text = progress.line(s, tmp_path, started=0.0, now=45.0, machine=machine(calibration()))
    # 4 + 4 + 2 s of warm-up and timed steps (the first step's 1 s beyond a steady one
    # left out) of 25 s of trials, 45 s of run; 2 x 3 s timed
    assert ("measuring 40% of the trials' wall time (10 s of 25 s in warm-up and timed "
            "steps, 24% in the timed steps") in text  # fmt: skip
    assert "noise reruns 5 s, 20%), 22% of this run's; every trial is done" in text


def test_a_resumed_run_counts_only_the_trials_it_measured_as_its_own(tmp_path):
    """The study's efficiency is over every record; this run's share of its own elapsed
    time only over the records it wrote (a resumed study's earlier hours are not in its
    elapsed time)."""
    import os

    s = small_study(trials=1)
    metrics = {"train_time_s": 5.0, "time_to_first_step_s": 2.0, "steps_timed": 3,
               "step_time_s": {"median": 1.0, "mean": 1.0}}  # fmt: skip
    for e in ("a", "b"):
        write_record(tmp_path, e, 0, wall=10.0, metrics=metrics)
    earlier = tmp_path / "records" / "a" / "trial0.json"
    resumed = earlier.stat().st_mtime + 3600.0  # this run began an hour after both
    os.utime(tmp_path / "records" / "b" / "trial0.json", (resumed + 5.0, resumed + 5.0))
    write_record(tmp_path, "c", 0, wall=10.0, metrics={"train_time_s": 4.0})
    os.utime(tmp_path / "records" / "c" / "trial0.json", (resumed - 5.0, resumed - 5.0))
    text = progress.line(s, tmp_path, started=resumed, now=resumed + 40.0,
                         machine=machine(calibration()))  # fmt: skip
    # the study: 4 + 4 + 4 s of 30 s; this run: b's 4 s of its 40 s
    assert "measuring 40% of the trials' wall time (12 s of 30 s" in text, text
    assert "), 10% of this run's; every trial is done" in text, text
    # a run that wrote no record yet says nothing of its own share
    os.utime(tmp_path / "records" / "b" / "trial0.json", (resumed - 1.0, resumed - 1.0))
    text = progress.line(s, tmp_path, started=resumed, now=resumed + 40.0,
                         machine=machine(calibration()))  # fmt: skip
    assert "of this run's" not in text and "in the timed steps)" in text, text


def test_the_first_steps_one_off_costs_are_its_time_beyond_a_steady_step():
    from workflow_scripts.util import first_step_one_off, measuring_seconds, timed_seconds

    # a compiled run: the first step compiles (56 s), a steady step takes 3.4 s
    compiled = {"train_time_s": 90.0, "time_to_first_step_s": 56.0, "steps_timed": 8,
                "step_time_s": {"median": 3.4, "mean": 3.5}}  # fmt: skip
    assert first_step_one_off(compiled) == pytest.approx(52.6)
    assert measuring_seconds(compiled) == pytest.approx(90.0 - 52.6)
    assert timed_seconds(compiled) == pytest.approx(28.0)
    # a first step faster than the median: nothing one-off, the whole loop measured
    assert first_step_one_off({**compiled, "time_to_first_step_s": 3.0}) == 0.0
    # no timed step says what steady is: the whole first step is one-off
    bare = {"train_time_s": 10.0, "time_to_first_step_s": 4.0}
    assert first_step_one_off(bare) == 4.0 and measuring_seconds(bare) == 6.0
    assert timed_seconds(bare) is None and measuring_seconds({"train_time_s": None}) is None
    # the timed steps are part of the step loop: none without its time, never more
    assert timed_seconds({k: v for k, v in compiled.items() if k != "train_time_s"}) is None
    assert timed_seconds({**compiled, "train_time_s": 70.0}) == pytest.approx(70.0 - 52.6)
    assert first_step_one_off({**bare, "step_time_s": "n/a"}) == 4.0


def test_every_trial_done(tmp_path):
    s = small_study(trials=1)
    for exp in ("a", "b", "c"):
        write_record(tmp_path, exp, 0, wall=5.0)
    text = progress.line(s, tmp_path, started=0.0, now=30.0, machine=machine(calibration()))
    assert text.startswith(
        "[progress] 3 of 3 trials have a record, 30 s elapsed in this run; every trial is done"
    )
    # what runs after the trials is still to come (the collectives at the trials' ratio)
    per = study_estimate.total(s.experiments, 1, machine(calibration()), Setup(s.envs))
    ratio = 15.0 / sum(p["seconds"] for p in per["experiments"].values())
    assert progress.speed(s, tmp_path, per["experiments"]).run == pytest.approx(ratio)
    after, jobs, *_ = progress.after_trials(s, tmp_path, scale=ratio)
    assert text.endswith(f"; then about {estimate_text.human(after)} for the {jobs} collectives "
                         "jobs and the report")  # fmt: skip


def test_the_time_left_holds_the_collectives_still_to_run(tmp_path):
    """The jobs after the trials count in the time left: a collectives variant without a
    result at the median wall time of those done (the estimate's before any), and the
    report; none said once every variant has its result."""
    s = small_study(trials=1)
    variants = s.settings["collectives"]["variants"]
    after, jobs, *_ = progress.after_trials(s, tmp_path)
    assert jobs == len(variants) and after > estimate.report_s(3)
    folder = tmp_path / "collectives"
    folder.mkdir()
    for k, variant in enumerate(variants[:-1]):
        (folder / f"{variant}.json").write_text(json.dumps({"process_wall_s": 40.0 + k}))
    after, jobs, *_ = progress.after_trials(s, tmp_path)
    walls = [40.0 + k for k in range(len(variants) - 1)]
    report = estimate.report_s(3)  # the study's report (one round: no round's report)
    assert jobs == 1 and after == pytest.approx(statistics.median(walls) + report)
    (folder / f"{variants[-1]}.json").write_text(json.dumps({"process_wall_s": 50.0}))
    after = progress.after_trials(s, tmp_path)
    assert (after.seconds, after.jobs, after.reports) == (pytest.approx(report), 0, 1)
    for exp in ("a", "b", "c"):
        write_record(tmp_path, exp, 0, wall=5.0)
    text = progress.line(s, tmp_path, started=0.0, now=30.0, machine=machine(calibration()))
    assert text.endswith("; every trial is done"), text


def test_the_start_is_set_once_and_inherited(monkeypatch):
    monkeypatch.delenv(progress.STARTED_VAR, raising=False)
    first = progress.started_at()
    assert progress.started_at() == first  # what every job's process inherits
    monkeypatch.setenv(progress.STARTED_VAR, "12.5")
    assert progress.started_at() == 12.5


def test_the_line_says_when_the_first_answer_was_written(tmp_path):
    s = small_study()
    m = machine(calibration())
    text = progress.line(s, tmp_path, started=1000.0, now=2000.0, machine=m)
    assert "first answer" not in text
    page = tmp_path / progress.FIRST_REPORT
    page.parent.mkdir(parents=True)
    page.write_text("<html></html>")
    os.utime(page, (1600.0, 1600.0))
    text = progress.line(s, tmp_path, started=1000.0, now=2000.0, machine=m)
    assert f"(the question's first answer: {page}, written 10 min into this run)" in text
    # then the headline's comparisons with their intervals (its second trials)
    second = tmp_path / progress.INTERVALS_REPORT
    second.parent.mkdir(parents=True)
    second.write_text("<html></html>")
    os.utime(second, (1900.0, 1900.0))
    text = progress.line(s, tmp_path, started=1000.0, now=2000.0, machine=m)
    assert (
        f"(the question's first answer: {page}, written 10 min into this run; with its "
        f"intervals: {second}, written 15 min into this run)"
    ) in text


def write_round(results, k: int, undecided: list[tuple[str, str]], decided=()) -> None:
    """Round k's report as far as the rounds read it: its comparisons and verdicts (and
    its page, which says that it is written)."""
    path = results / "rounds" / str(k) / "comparisons.csv"
    (path.parent / "report").mkdir(parents=True, exist_ok=True)
    (path.parent / "report" / "index.html").write_text("<html></html>")
    rows = ["baseline,experiment,verdict,headline,ratio,ci_low,ci_high,margin"]
    rows += [f"{b},{e},undecided,False,1.1,0.9,1.3,0.03" for b, e in undecided]
    rows += [f"{b},{e},faster,False,2.0,1.9,2.1,0.03" for b, e in decided]
    path.write_text("\n".join(rows) + "\n")


def adaptive_study() -> study.Study:
    """Three experiments, 2 trials each and up to 4 where comparisons stay undecided."""
    config = {
        "trials": 2,
        "max_trials": 4,
        "defaults": {"model": "resnet50", "image_size": 224, "batch_size": 16, "steps": 20},
        "groups": {"g": {"runs": [{"id": "a"}, {"id": "b", "precision": "bf16"}, {"id": "c"}]}},
    }
    return study.load_study(config)


def test_the_adaptive_rounds_have_a_time_left_too(tmp_path):
    """Up to max_trials where comparisons stay undecided: while the minimum runs, the
    line says what the rounds may add at most; once a round's report has decided which
    experiments go on, their trials are the time left, with the next round as that
    report's comparisons forecast it, and at most every one of them to the cap."""
    s, m = adaptive_study(), machine(calibration())
    per = study_estimate.total(s.experiments, 2, m, Setup(s.envs))["experiments"]
    later = {e: per[e]["later_seconds"] for e in "abc"}
    after, *_ = progress.after_trials(s, tmp_path)
    # one report (round 2's, which round 1's decides; round 3, the last, writes none)
    each = progress.after_trials(s, tmp_path).each_report
    human = estimate_text.human
    # the minimum running: the rounds may add two more trials of each, at most
    write_record(tmp_path, "a", 0, wall=per["a"]["seconds"])
    text = progress.line(s, tmp_path, started=0.0, now=60.0, machine=m)
    assert text.startswith("[progress] 1 of 6 trials have a record"), text
    most = 2 * sum(later.values())
    assert f"; the adaptive rounds then up to about {human(most + each)} more, where" in text
    # the minimum done, no round report yet: what the rounds may add
    for e, k in [("b", 0), ("c", 0), ("a", 1), ("b", 1), ("c", 1)]:
        write_record(tmp_path, e, k, wall=per[e]["seconds"] if k == 0 else later[e])
    text = progress.line(s, tmp_path, started=0.0, now=600.0, machine=m)
    assert "the 6 trials of the minimum are done: more (up to 4 each)" in text, text
    assert f"up to about {human(most + after + each)} more" in text, text
    # round 1's report: a against b undecided, c decided; round 2 runs a and b
    write_round(tmp_path, 1, [("a", "b")], decided=[("a", "c")])
    after = progress.after_trials(s, tmp_path).seconds + each  # round 1's written, 2's not
    text = progress.line(s, tmp_path, started=0.0, now=600.0, machine=m)
    assert text.startswith("[progress] 6 of 8 trials have a record"), text
    assert "adaptive round 2 (trial 3 of up to 4 each): 2 experiments still undecided, " in text
    assert "2 trials without a record" in text
    ab = later["a"] + later["b"]
    # likely: round 2's, and round 3 as round 1's comparisons forecast it (the chance
    # that a against b is still undecided at 3 trials each); at most both
    rows = rounds.read_rows(tmp_path / "rounds" / "1" / "comparisons.csv")
    chance = forecast.chances(rows, s.settings, 1, 3, {"a", "b"})
    assert 0 < chance["a"] == chance["b"] < 1 and chance.get("c", 0) == 0, chance
    guess, upper = ab + chance["a"] * ab + after, 2 * ab + after
    assert f"about {human(guess)} left, up to {human(upper)} if every one goes on" in text, text
    assert "x 1.00: measured/estimated so far" in text
    # a's trial 2 done, taking twice its estimate: the rest is scaled by what was measured,
    # b's trial 2 at b's own later trial (on time) drawn towards its group's ratio
    write_record(tmp_path, "a", 2, wall=2 * later["a"])
    text = progress.line(s, tmp_path, started=0.0, now=900.0, machine=m)
    assert text.startswith("[progress] 7 of 8 trials have a record") and "1 trial without" in text
    done = sum(per[e]["seconds"] + later[e] for e in "abc")
    run = (done + 2 * later["a"]) / (done + later["a"])  # (one group: its ratio is the run's)
    own = {"a": (3 + run) / 3, "b": (1 + run) / 2, "c": (1 + run) / 2}
    ratio = sum(later[e] * own[e] for e in "abc") / sum(later.values())
    assert f"x {ratio:.2f}: measured/estimated so far by group (the run's {run:.2f})" in text
    # round 2 done, its report decides every comparison: nothing is left
    write_record(tmp_path, "b", 2, wall=later["b"])
    write_round(tmp_path, 2, [], decided=[("a", "b"), ("a", "c")])
    text = progress.line(s, tmp_path, started=0.0, now=1200.0, machine=m)
    assert "8 of 8 trials have a record" in text and "every trial is done" in text, text


def test_a_rounds_trials_are_at_their_own_experiments_ratio(tmp_path):
    """The adaptive rounds run the experiments whose comparisons stay undecided, which
    are not their group's average: a round's trial is scaled by its experiment's own
    later trials (measured over estimated, drawn towards its group's as if the group's
    were one more of them), not by the group's alone; a first trial (which pays the
    compile and the check its later trials carry) is not one of them."""
    s, m = adaptive_study(), machine(calibration())
    per = study_estimate.total(s.experiments, 2, m, Setup(s.envs))["experiments"]
    later = {e: per[e]["later_seconds"] for e in "abc"}
    # every first trial on time; the second trials: a and b at half their estimates, c
    # (whose comparison is decided) at twice its estimate
    at = {"a": 0.5, "b": 0.5, "c": 2.0}
    for e in "abc":
        write_record(tmp_path, e, 0, wall=per[e]["seconds"])
        write_record(tmp_path, e, 1, wall=at[e] * later[e])
    write_round(tmp_path, 1, [("a", "b")], decided=[("a", "c")])
    text = progress.line(s, tmp_path, started=0.0, now=600.0, machine=m)
    est = sum(per[e]["seconds"] + later[e] for e in "abc")
    run = sum(per[e]["seconds"] + at[e] * later[e] for e in "abc") / est
    own = {e: (at[e] + run) / 2 for e in "abc"}
    # round 2: a and b, each at its own ratio; round 3 as forecast (the same two, by chance)
    rows = rounds.read_rows(tmp_path / "rounds" / "1" / "comparisons.csv")
    chance = forecast.chances(rows, s.settings, 1, 3, {"a", "b"})["a"]
    after = progress.after_trials(s, tmp_path)
    ab = later["a"] * own["a"] + later["b"] * own["b"]
    left = ab * (1 + chance) + after.seconds + after.each_report
    assert f"about {estimate_text.human(left)} left" in text, text
    walls = {(e, 0): per[e]["seconds"] for e in "abc"} | {(e, 1): at[e] * later[e] for e in "abc"}
    speed = progress.speed_of(walls, lambda e, k: per[e]["seconds"] if k == 0 else later[e],
                              progress.groups_of(s.experiments))  # fmt: skip
    assert speed.own == pytest.approx(own) and speed.groups["g"] == pytest.approx(run)
    assert speed.of_trial("a", 0, {"a": "g"}) == pytest.approx(run)  # a first trial: its group's
    # at the group's ratio a's and b's trials would have counted well over what their own say
    assert own["a"] == own["b"] < 0.8 * run


def test_an_experiment_that_sat_out_a_round_and_comes_back_is_in_the_time_left(tmp_path):
    """Round 2 runs a and b; its report leaves a against c undecided (a's third trial
    moved it) and decides a against b: round 3 runs a and c (c sat out round 2,
    rules/common.smk), and the time left is those two trials."""
    s, m = adaptive_study(), machine(calibration())
    per = study_estimate.total(s.experiments, 2, m, Setup(s.envs))["experiments"]
    later = {e: per[e]["later_seconds"] for e in "abc"}
    for e, k in [(e, k) for k in (0, 1) for e in "abc"] + [("a", 2), ("b", 2)]:
        write_record(tmp_path, e, k, wall=per[e]["seconds"] if k == 0 else later[e])
    write_round(tmp_path, 1, [("a", "b")], decided=[("a", "c")])
    write_round(tmp_path, 2, [("a", "c")], decided=[("a", "b")])
    text = progress.line(s, tmp_path, started=0.0, now=900.0, machine=m)
    assert text.startswith("[progress] 8 of 10 trials have a record"), text
    assert "adaptive round 3 (trial 4 of up to 4 each): 2 experiments still undecided" in text
    assert "2 trials without a record" in text, text
    left = estimate_text.human(later["a"] + later["c"] + progress.after_trials(s, tmp_path).seconds)
    assert f"about {left} left" in text, text


def test_the_minimums_time_left_holds_the_rounds_as_the_comparisons_so_far_forecast_them(
    tmp_path,
):
    """While the minimum runs, once a provisional report has comparisons, the rounds
    are in the time left as they forecast them (plan/forecast.py): a against b a few
    percent apart goes on, c far from a does not; beside it, what every experiment
    going on to the cap would add. (Without a report, the bound alone: above.)"""
    s, m = adaptive_study(), machine(calibration())
    est = study_estimate.total(s.experiments, 2, m, Setup(s.envs), Known([("a", 0)]))
    per = est["experiments"]
    later = {e: per[e]["later_seconds"] for e in "abc"}
    write_record(tmp_path, "a", 0, wall=per["a"]["seconds"])  # as estimated: x 1.00
    first = tmp_path / "rounds" / "first" / "comparisons.csv"
    first.parent.mkdir(parents=True)
    first.write_text(
        "baseline,experiment,verdict,headline,ratio,ci_low,ci_high,margin,n_baseline,"
        "n_experiment,confidence\n"
        "a,b,undecided,False,1.08,,,0.03,1,1,0.9964\n"
        "a,c,undecided,False,2.5,,,0.03,1,1,0.9964\n"
    )
    text = progress.line(s, tmp_path, started=0.0, now=60.0, machine=m)
    rows = rounds.read_rows(first)
    going = [forecast.chances(rows, s.settings, 0, k, set("abc")) for k in (2, 3)]
    assert all(g["c"] == 0 < g["a"] == g["b"] for g in going), going
    rounds_s = sum(g["a"] * (later["a"] + later["b"]) for g in going)
    most = 2 * sum(later.values())
    after, *_ = progress.after_trials(s, tmp_path)
    human = estimate_text.human
    left = est["remaining_trials_s"]
    assert f"about {human(left + rounds_s + after)} left (the estimate of {human(left)}" in text
    assert (
        f"and of {human(rounds_s)} for the adaptive rounds, as the comparisons so far "
        "forecast them, x 1.00" in text
    ), text
    assert f"; up to about {human(most - rounds_s)} more if every experiment goes on to 4" in text


def test_a_budgets_reserve_not_yet_planned_counts_up_to_the_budgets_end(tmp_path, monkeypatch):
    """Before the budget's plan is made again (study/replan.py) the time left is the
    plan's own trials and what fits of the reserve's (``reserve_s``), no later than the
    budget's end."""
    from workflow_scripts.plan import clock

    s, m, predicted = predicted_study()
    write_record(tmp_path, "a", 0, wall=predicted["a"]["seconds"])  # as estimated: x 1.00
    own = progress.line(s, tmp_path, started=0.0, now=100.0, machine=m)
    left = study_estimate.total(s.experiments, 2, m, Setup(s.envs), Known([("a", 0)]))[
        "remaining_trials_s"
    ]
    own_s = left + progress.after_trials(s, tmp_path)[0]
    assert f"about {estimate_text.human(own_s)} left" in own
    monkeypatch.setenv(clock.DEADLINE_VAR, "10000")
    fits = progress.line(s, tmp_path, started=0.0, now=100.0, machine=m, reserve_s=50.0)
    assert f"about {estimate_text.human(own_s + 50.0)} left" in fits, fits
    assert "then, planned again after the first trials, what fits of the budget's reserve" in fits
    capped = progress.line(s, tmp_path, started=0.0, now=100.0, machine=m, reserve_s=1e6)
    assert f"about {estimate_text.human(9900.0)} left" in capped, capped
    monkeypatch.delenv(clock.DEADLINE_VAR)  # no budget: no reserve to fill it
    assert progress.line(s, tmp_path, started=0.0, now=100.0, machine=m, reserve_s=50.0) == own


def test_a_budgets_clock_holds_the_time_left_to_what_it_lets_run(tmp_path, monkeypatch):
    """Under a budget the time left counts no trial that the clock will leave out: the
    trials' part at most the time to the deadline less what the clock keeps after them
    (a budget=1h default study's last lines counted 4 trials the clock then left out:
    1.3-1.6x the time then left)."""
    from workflow_scripts.plan import clock

    for var in (clock.DEADLINE_VAR, clock.AFTER_VAR, clock.LEAST_VAR):
        monkeypatch.setenv(var, "")  # (restored after the test: keep_after sets two)
        monkeypatch.delenv(var)
    s, m, predicted = predicted_study()
    write_record(tmp_path, "a", 0, wall=predicted["a"]["seconds"])
    free = progress.line(s, tmp_path, started=0.0, now=100.0, machine=m)
    after = progress.after_trials(s, tmp_path).seconds
    # far from the deadline: the same line
    monkeypatch.setenv(clock.DEADLINE_VAR, "1e9")
    assert progress.line(s, tmp_path, started=0.0, now=100.0, machine=m) == free
    # 30 s kept after the trials (the least: the estimate's 20 s at the records' scale,
    # their wall over the estimate each holds, is less), 10 s of trials before them
    clock.keep_after(20.0, least=30.0)
    assert clock.kept(clock.ratio(tmp_path / "records")) == 30.0
    monkeypatch.setenv(clock.DEADLINE_VAR, str(100.0 + 30.0 + 10.0))
    held = progress.line(s, tmp_path, started=0.0, now=100.0, machine=m)
    assert f"about {estimate_text.human(10.0 + after)} left (the estimate" in held, held
    assert "; no more: the budget's clock leaves out the trials that would end too late" in held
    assert progress.held_by_clock(1e6, after, tmp_path / "records", now=100.0) == 10.0 + after
    # past the point where any trial starts: what runs after them alone
    assert progress.held_by_clock(1e6, after, tmp_path / "records", now=500.0) == after


def test_the_reports_still_to_write_are_in_the_time_left_as_this_studys_measured(tmp_path):
    """Every report not yet written is in the time left, at ``estimate.report_s`` of the
    experiments it holds: the question's stages' (of the headline's group), round 0's
    (each round's but the last) and the study's; one written is not. Once a report has
    its benchmark (Snakemake's: rules/report.smk), the others are scaled as it was off."""
    config = {
        "trials": 2,
        "defaults": {"model": "cnn", "image_size": 32, "batch_size": 8, "steps": 20},
        "groups": {"g": {"runs": [{"id": "a"}]},
                   "h": {"runs": [{"id": "b"}, {"id": "c", "threads": 1}]}},
    }  # fmt: skip
    s, logs = study.load_study(config), tmp_path / "logs"
    stages = order.stages(s.experiments, 2)
    assert stages == {"first": ["a"], "headline": ["a"]}, stages
    collectives = len(s.settings["collectives"]["variants"]) * estimate.COLLECTIVES_S
    sizes = [1, 1, 3, 3]  # the stages', round 0's, the study's
    after = progress.after_trials(s, tmp_path, logs)
    assert after.reports == 4
    assert after.seconds == pytest.approx(collectives + sum(map(estimate.report_s, sizes)))
    assert after.each_report == pytest.approx(estimate.report_s(3))
    # the first stage's report written, in twice the estimate for the one experiment
    # its summary holds
    stage = tmp_path / "rounds" / "first"
    (stage / "report").mkdir(parents=True)
    (stage / "report" / "index.html").write_text("<html></html>")
    (stage / "summary.csv").write_text("experiment,trial,status\na,0,ok\n")
    bench = logs / progress.ROUND_BENCHMARKS / "first.tsv"
    bench.parent.mkdir(parents=True)
    bench.write_text(f"s\th:m:s\tmax_rss\n{2 * estimate.report_s(1):.4f}\t0:00:13\t100.5\n")
    after = progress.after_trials(s, tmp_path, logs)
    assert after.reports == 3
    assert after.seconds == pytest.approx(
        collectives + 2 * sum(map(estimate.report_s, sizes[1:])), abs=1e-3
    )
    assert after.each_report == pytest.approx(2 * estimate.report_s(3), abs=1e-3)
    # and the line says them
    text = progress.line(s, tmp_path, started=0.0, now=60.0, machine=machine(calibration()),
                         logs=logs)  # fmt: skip
    jobs = len(s.settings["collectives"]["variants"])
    said = f"then about {estimate_text.human(after.seconds)} for the {jobs} collectives jobs"
    assert f"{said} and 3 reports" in text, text


def test_an_incorrect_first_trial_predicts_no_later_ones(tmp_path):
    """A first trial whose step was incorrect: its experiment's later trials run nothing
    (trial/carry.py), so the time left counts none for them."""
    s, m, predicted = predicted_study()
    write_record(tmp_path, "a", 0, wall=predicted["a"]["seconds"])
    write_record(tmp_path, "b", 0, wall=30.0, status="incorrect")
    assert study_estimate.failed_walls(tmp_path, s.experiments, 2) == {"b": 0.0}
    done = [("a", 0), ("b", 0)]
    est = study_estimate.total(s.experiments, 2, m, Setup(s.envs), Known(done, failed={"b": 0.0}))
    assert est["experiments"]["b"]["later_seconds"] == 0.0 and est["remaining_repeats_s"] == 0.0
    # the time left: as if b were done, less its trial 1
    ok = study_estimate.total(s.experiments, 2, m, Setup(s.envs), Known(done))
    left = ok["remaining_trials_s"] - predicted["b"]["later_seconds"]
    assert est["remaining_trials_s"] == pytest.approx(left, abs=0.1)  # (to 0.1 s)


def test_a_replay_of_a_resumed_run_leaves_out_the_pause(tmp_path):
    """tests/benchmarks/progress_replay.py: a study stopped and resumed is two Snakemake
    sessions (their logs' names and modification times); the time left after a line is
    the running time of the sessions after it, not the hours between them, and a later
    session that wrote no record (a report made again) is not part of the run."""
    from datetime import datetime

    from tests.benchmarks import progress_replay as replay

    logs = tmp_path / ".snakemake" / "log"
    logs.mkdir(parents=True)
    record = tmp_path / "results" / "records" / "baseline" / "trial0.json"
    record.parent.mkdir(parents=True)
    record.write_text("{}")
    t0 = datetime(2026, 12, 5, 9, 0, 0).timestamp()
    spans = [
        (t0, t0 + 600),
        (t0 + 4 * 3600, t0 + 4 * 3600 + 900),
        (t0 + 9 * 3600, t0 + 9 * 3600 + 15),
    ]
    for start, end in spans:
        log = logs / f"{datetime.fromtimestamp(start):%Y-%m-%dT%H%M%S.%f}.snakemake.log"
        log.write_text("")
        os.utime(log, (end, end))
    written = [t0 + 100, t0 + 500, t0 + 4 * 3600 + 300]
    run = replay.sessions(tmp_path / "results", written)
    assert run == spans[:2]
    # 100 s into the first session: its 500 s left and the whole second one's 900
    assert replay.running_left(t0 + 100, run) == 500 + 900
    assert replay.running_left(t0 + 4 * 3600 + 300, run) == 600
    # no logs: one session, from the first record to the newest file
    os.utime(record, (t0 + 700, t0 + 700))
    for log in logs.iterdir():
        log.unlink()
    assert replay.sessions(tmp_path / "results", written[:2]) == [(t0 + 100, t0 + 700)]
