"""The progress line after every trial: trials done of all, elapsed, and the time left
from the estimate scaled by what the trials done so far measured against theirs."""

from __future__ import annotations

import json
import re

from workflow_scripts import study
from workflow_scripts.plan import estimate, progress

from .test_estimate import calibration, machine


def small_study(trials: int = 2) -> study.Study:
    config = {
        "trials": trials,
        "defaults": {"model": "cnn", "image_size": 32, "batch_size": 8, "steps": 20},
        "experiments": [{"id": "a"}, {"id": "b", "precision": "bf16"}, {"id": "c"}],
    }
    return study.load_study(config)


def write_record(results, exp: str, trial: int, wall: float | None) -> None:
    path = results / "records" / exp / f"trial{trial}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    # the record's own estimate (the trial's, from the calibration alone) is not used
    record = {"status": "ok", "trial_wall_s": wall, "estimate": {"seconds": 1e6}}
    path.write_text(json.dumps(record))


def test_nothing_done_yet_says_the_estimate(tmp_path):
    s = small_study()
    m = machine(calibration())
    text = progress.line(s, tmp_path, started=100.0, now=160.0, machine=m)
    assert text.startswith("[progress] 0 of 6 trials have a record, 60 s elapsed in this run")
    left = estimate.total(s.experiments, 2, m, envs=s.envs)["remaining_trials_s"]
    assert f"about {estimate.human(left)} left (the estimate, nothing measured yet)" in text


def test_the_time_left_is_scaled_by_what_was_measured(tmp_path):
    s = small_study()
    m = machine(calibration())
    # the two trials done took twice what the same estimate predicts for them
    predicted = estimate.total(s.experiments, 2, m, envs=s.envs)["experiments"]
    write_record(tmp_path, "a", 0, wall=2 * predicted["a"]["seconds"])
    write_record(tmp_path, "b", 0, wall=2 * predicted["b"]["seconds"])
    text = progress.line(s, tmp_path, started=0.0, now=7200.0, machine=m)
    done = [("a", 0), ("b", 0)]
    left = estimate.total(s.experiments, 2, m, envs=s.envs, done=done)["remaining_trials_s"]
    assert text.startswith("[progress] 2 of 6 trials have a record, 2.0 h elapsed")
    assert f"about {estimate.human(2 * left)} left" in text
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


def test_every_trial_done(tmp_path):
    s = small_study(trials=1)
    for exp in ("a", "b", "c"):
        write_record(tmp_path, exp, 0, wall=5.0)
    text = progress.line(s, tmp_path, started=0.0, now=30.0, machine=machine(calibration()))
    assert (
        text
        == "[progress] 3 of 3 trials have a record, 30 s elapsed in this run; every trial is done"
    )


def test_the_start_is_set_once_and_inherited(monkeypatch):
    monkeypatch.delenv(progress.STARTED_VAR, raising=False)
    first = progress.started_at()
    assert progress.started_at() == first  # what every job's process inherits
    monkeypatch.setenv(progress.STARTED_VAR, "12.5")
    assert progress.started_at() == 12.5
