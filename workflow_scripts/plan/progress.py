"""Progress a person can follow over hours: after every finished trial, how many of the
study's trials have a record, how long this run has taken, and how long the rest should
take.

The rest is the study's estimate for the trials without a record
(``study_estimate.total``, from the calibrations and the pre-flight), scaled by how far
the same estimate was off for the trials done so far (their wall time, each record's
``trial_wall_s``, against what the same estimate predicts for them): an estimate that
was 1.5x optimistic for the first trials is taken as 1.5x optimistic for the others. A
trial's noise reruns (``retry_wall_s``) are left out of its wall time: one trial run
three times says nothing of the others; the run's noise reruns are added instead at
their rate in this run so far (their time over the kept trials' wall: an earlier
sitting's reruns say how busy the machine was then), weighed down while few trials
say (:func:`rerun_share`: left out, 80 trials of the default study on two busy CPUs took
1.47x the time the lines had said, its reruns 16 % of the trials' wall). Nor is a trial
that did not end ok (failed, out of memory, timed out, incorrect): a failure after
seconds where a whole trial was predicted says nothing of the trials that run; its
experiment's trials yet to run are predicted at its own wall time, the same end again,
and added as measured, not scaled (on an AVX2 CPU the default study's IPEX bf16 runs
fail in seconds: counted, they had turned the ratio from 0.93 to 0.62). Where the
trials' own ratios disagree (a few, or unlike ones), the line gives the range that their
spread allows. (Not against each record's own estimate, made by the trial from the
calibration alone: scaling the pre-flight's estimate by that ratio corrected it twice,
to 69 min left where 2.8 h were.) Each trial left is scaled by its group's ratio where
the group's trials say (:func:`group_ratios`: drawn towards the run's, as if the run's
were one more of its trials), by the run's where none has run yet: the study runs its
groups in turn (plan/order.py), and a tail of unlike trials (BERT's DDP runs at 1.26x
their estimate after a ladder at 0.77x) is not the run's ratio. Host side, standard
library only; the records are read once each (cached by path and modification time), so
a line costs milliseconds in a long run.

The adaptive rounds (up to ``max_trials`` where comparisons stay undecided) are in the
time left too (:func:`rounds_ahead`): as the latest report's comparisons forecast them
(plan/forecast.py; before any report, only what they may add at most, beside the time
left); once a round's report has decided which experiments go on, their trials without
a record, plus the later rounds as forecast, and at most every one of them to the cap;
the trials of the rounds count in the ratio like the others. (Counted as a bound beside
the minimum, the rounds made the default study's lines 0.94x to 7.5x of the time it
then took; forecast, 0.75x to 1.19x.) A round's trial is scaled by its experiment's own
later trials where it has one (:func:`own_ratios`, drawn towards its group's): the
rounds run the experiments whose comparisons stay undecided, and these are not their
groups' average (``tests/benchmarks/progress_states.py``).
"""

from __future__ import annotations

import csv
import math
import os
import statistics
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import NamedTuple

from ..util import UnreadableFile, finite, measuring_seconds, read_json, timed_seconds
from . import clock, estimate, estimate_text, order, rounds, study_estimate
from . import forecast as forecast_

#: when this run started (seconds since the epoch), set once by the main process and
#: inherited by every job's process (a cluster job's too)
STARTED_VAR = "STUDY_STARTED_AT"
#: the correction applied to the estimate stays within these bounds (a few odd trials
#: must not turn "2 h left" into "2 days left")
RATIO_BOUNDS = clock.RATIO_BOUNDS
#: a group's trials measure its own ratio, drawn towards the run's as if the run's were
#: this many more trials of the group (one: a group's first trial and the whole run weigh
#: the same). The default study's budget run of 2026-12-04 ended on a tail of BERT DDP
#: trials at 1.26x their estimate while the run's ratio was 0.83 (the ladder's 0.77):
#: its last lines said 0.69-0.76x of the time then left; replayed by group, 0.83-0.88x
GROUP_PRIOR_TRIALS = 1
#: an experiment's later trials measure its own ratio, drawn towards its group's as if the
#: group's were this many more of its trials. The adaptive rounds run the experiments
#: whose comparisons stay undecided, and these are not their groups' average: in the
#: default study's run of 2026-12-07 (2-vCPU AVX-512 EPYC) its third trials took 0.94x
#: their experiments' second ones but 0.83x what their groups' ratios said (more of
#: them stopped far from their baselines or at their step precision); at the start of
#: round 2 the line said 44 min left where 35 were
OWN_PRIOR_TRIALS = 1
#: the time left is given as a range too where the trials' ratios make it this uncertain
RANGE_FROM = 1.15
#: the noise reruns' rate so far counts as if this many more trials had had none (one
#: trial run three times early on is not the study's rate; thirty trials mostly are)
RERUN_PRIOR_TRIALS = 10

_cache: dict[str, tuple[int, Times]] = {}


def started_at() -> float:
    """This run's start: the inherited one, else now (and then every job inherits it)."""
    value = os.environ.get(STARTED_VAR)
    try:
        return float(value)
    except (TypeError, ValueError):
        os.environ[STARTED_VAR] = f"{time.time():.3f}"
        return float(os.environ[STARTED_VAR])


_MISSING = object()


class Times(NamedTuple):
    """A record's times: its wall time without its noise reruns, their time, its warm-up
    and timed steps' time, its timed steps' (None where it does not say); and where it
    did not end ok, its wall time again (``study_estimate.failed_wall``), else None; and
    when the record was written (seconds since the epoch, None where not known)."""

    wall: float | None
    retry: float
    measuring: float | None
    timed: float | None
    failed: float | None
    written: float | None = None


def _times(record) -> Times:
    """A record's :class:`Times`."""
    if not isinstance(record, dict):
        return Times(None, 0.0, None, None, None)
    wall, retry = record.get("trial_wall_s"), record.get("retry_wall_s")
    retry = float(retry) if finite(retry) and retry > 0 else 0.0
    kept = float(wall) - retry if finite(wall) and wall - retry > 0 else None
    metrics = record.get("metrics")
    failed = study_estimate.failed_wall(record)
    return Times(kept, retry, measuring_seconds(metrics), timed_seconds(metrics), failed)


def _wall(path: Path):
    """A record's times (``_times``); ``_MISSING`` without a record."""
    try:
        mtime = path.stat().st_mtime_ns
    except OSError:
        return _MISSING
    key = str(path)
    hit = _cache.get(key)
    if hit and hit[0] == mtime:
        return hit[1]
    try:
        record = read_json(path, want=None)
    except (OSError, ValueError):
        return _times(None)
    times = _times(record)._replace(written=mtime / 1e9)
    _cache[key] = (mtime, times)
    return times


def measure(
    experiments: Iterable[Mapping], trials: int, results: Path
) -> tuple[list[tuple[str, int]], dict[tuple[str, int], Times]]:
    """The (experiment, trial) pairs with a record, trials 0 to ``trials - 1``, and the
    times of each (``_times``)."""
    done: list[tuple[str, int]] = []
    times: dict[tuple[str, int], Times] = {}
    for spec in experiments:
        for k in range(trials):
            got = _wall(results / "records" / spec["id"] / f"trial{k}.json")
            if got is _MISSING:
                continue
            done.append((spec["id"], k))
            times[(spec["id"], k)] = got
    return done, times


def ok_walls(times: Mapping[tuple[str, int], Times]) -> dict[tuple[str, int], float]:
    """Each trial's wall time without its noise reruns, of those that ended ok: a rerun
    is not extrapolated to the whole study, nor is a trial that failed (a failure after
    seconds where an hour was predicted says nothing of the others)."""
    return {key: t.wall for key, t in times.items() if t.wall is not None and t.failed is None}


def ratio_of(walls: Mapping[tuple[str, int], float], predicted) -> float:
    """Measured over estimated of the trials ``walls`` (``predicted(e, k)``: a trial's
    estimate), within :data:`RATIO_BOUNDS`; 1 where nothing is measured."""
    est_sum = sum(predicted(e, k) for e, k in walls)
    if est_sum <= 0:
        return 1.0
    return min(max(sum(walls.values()) / est_sum, RATIO_BOUNDS[0]), RATIO_BOUNDS[1])


def groups_of(experiments: Iterable[Mapping]) -> dict[str, str]:
    """Each experiment's group (its own id where it has none), as the estimate sums them."""
    return {spec["id"]: spec.get("group") or spec["id"] for spec in experiments}


def group_ratios(
    walls: Mapping[tuple[str, int], float], predicted, group_of: Mapping[str, str], run: float
) -> dict[str, float]:
    """Each group's measured over estimated (``group_of``: an experiment's group), of
    its trials in ``walls``, drawn towards the run's (``run``: :func:`ratio_of`) as if the
    run's were :data:`GROUP_PRIOR_TRIALS` more of its trials; within :data:`RATIO_BOUNDS`.
    A group without a trial done is not in it (the run's ratio is its best guess)."""
    sums: dict[str, list[float]] = {}
    for (e, k), wall in walls.items():
        est = predicted(e, k)
        if est > 0:
            got = sums.setdefault(group_of.get(e, e), [0.0, 0.0, 0])
            got[0], got[1], got[2] = got[0] + wall, got[1] + est, got[2] + 1
    ratios = {}
    for group, (wall, est, n) in sums.items():
        prior = GROUP_PRIOR_TRIALS * est / n
        ratio = (wall + prior * run) / (est + prior)
        ratios[group] = min(max(ratio, RATIO_BOUNDS[0]), RATIO_BOUNDS[1])
    return ratios


def own_ratios(
    walls: Mapping[tuple[str, int], float], predicted, group_of: Mapping[str, str],
    groups: Mapping[str, float], run: float,
) -> dict[str, float]:  # fmt: skip
    """Each experiment's measured over estimated of its later trials in ``walls`` (trial 1
    on: a first trial pays what they carry, its compile and gradient check), drawn
    towards its group's ratio (``groups``, else ``run``) as if the group's were
    :data:`OWN_PRIOR_TRIALS` more of its trials; within :data:`RATIO_BOUNDS`. An
    experiment without a later trial done is not in it (its group's is its best guess)."""
    sums: dict[str, list[float]] = {}
    for (e, k), wall in walls.items():
        est = predicted(e, k)
        if k > 0 and est > 0:
            got = sums.setdefault(e, [0.0, 0.0, 0])
            got[0], got[1], got[2] = got[0] + wall, got[1] + est, got[2] + 1
    ratios = {}
    for e, (wall, est, n) in sums.items():
        prior = OWN_PRIOR_TRIALS * est / n
        ratio = (wall + prior * groups.get(group_of.get(e, e), run)) / (est + prior)
        ratios[e] = min(max(ratio, RATIO_BOUNDS[0]), RATIO_BOUNDS[1])
    return ratios


class Speed(NamedTuple):
    """How far an estimate is off for the trials with a record: the run's measured over
    estimated, each group's (:func:`group_ratios`), and how many trials they are from;
    and each experiment's for its later trials where it has one done (:func:`own_ratios`)."""

    run: float
    groups: dict[str, float]
    trials: int
    own: Mapping[str, float] = {}

    def of(self, group: str) -> float:
        """The ratio a trial of ``group`` is scaled by: its group's, else the run's."""
        return self.groups.get(group, self.run)

    def of_trial(self, e: str, k: int, group_of: Mapping[str, str]) -> float:
        """The ratio trial ``k`` of experiment ``e`` is scaled by: a later trial's at its
        experiment's own where it has a later trial done, else at its group's."""
        if k > 0 and e in self.own:
            return self.own[e]
        return self.of(group_of.get(e, e))

    def ahead(self, trials: Iterable[tuple[str, int, float]], group_of: Mapping[str, str]) -> float:
        """The ratio of the ``trials`` ahead ((experiment, trial, estimated seconds)),
        each at its own (:meth:`of_trial`), weighed by its estimate; the run's without
        any."""
        est = at = 0.0
        for e, k, seconds in trials:
            est += seconds
            at += seconds * self.of_trial(e, k, group_of)
        return at / est if est > 0 else self.run


def speed_of(
    walls: Mapping[tuple[str, int], float], predicted, group_of: Mapping[str, str]
) -> Speed:
    """The :class:`Speed` of the trials ``walls`` (``predicted(e, k)``: a trial's
    estimate)."""
    run = ratio_of(walls, predicted)
    groups = group_ratios(walls, predicted, group_of, run)
    return Speed(run, groups, len(walls), own_ratios(walls, predicted, group_of, groups, run))


def speed(study, results: Path | str, per: Mapping[str, Mapping]) -> Speed:
    """How far the estimate ``per`` (``study_estimate.total``'s experiments) is off for
    the trials of ``study`` with a record under ``results`` (:class:`Speed`: as the
    progress line scales the time left)."""
    done, times = measure(study.experiments, rounds.cap(study.settings), Path(results))
    walls = {k: w for k, w in ok_walls(times).items() if k[0] in per}

    def predicted(e: str, k: int) -> float:
        return per[e]["seconds"] if k == 0 else per[e].get("later_seconds", per[e]["seconds"])

    return speed_of(walls, predicted, groups_of(study.experiments))


#: the question's provisional reports (rules/common.smk, plan/order.py): the first, and
#: the headline's comparisons with their intervals (its second trials)
FIRST_REPORT = Path("rounds") / "first" / "report" / "index.html"
INTERVALS_REPORT = Path("rounds") / "headline" / "report" / "index.html"


def first_answer(results: Path, elapsed: float, now: float | None = None) -> str:
    """Where the question's provisional reports are and when they were written in this
    run ("" before the first exists)."""
    now = now if now is not None else time.time()

    def when(report: Path) -> str | None:
        try:
            written = (results / report).stat().st_mtime
        except OSError:
            return None
        since = elapsed - (now - written)
        return f"{estimate_text.human(since)} into this run" if since >= 0 else "before this run"

    first = when(FIRST_REPORT)
    if first is None:
        return ""
    text = f" (the question's first answer: {results / FIRST_REPORT}, written {first}"
    intervals = when(INTERVALS_REPORT)
    if intervals is not None:
        text += f"; with its intervals: {results / INTERVALS_REPORT}, written {intervals}"
    return text + ")"


class Rounds(NamedTuple):
    """The adaptive rounds still to run, in estimated seconds (before scaling): what the
    rounds whose experiments are known still need (``known``: a round report decided
    them), what the next unknown round would need if as many go on as went on last
    time (``likely``), and if every experiment that may go on does, up to the cap
    (``most``, ``known`` included); the round now running and the cap, for the text."""

    known: float
    likely: float
    most: float
    round: int
    cap: int
    going: int
    missing: int
    decided: int
    #: whether ``likely`` is the comparisons' forecast (plan/forecast.py)
    forecast: bool = False
    #: the rounds' reports still to write (each round's but the last ends in one), as
    #: ``likely`` counts them (a round's chance of running at all) and as ``most``
    reports: float = 0.0
    reports_most: int = 0


def rounds_ahead(
    ids: list[str], per: Mapping[str, Mapping], here: Path, trials: int, most: int,
    settings: Mapping | None = None,
) -> Rounds | None:  # fmt: skip
    """The adaptive rounds' time left (:class:`Rounds`; None without adaptive rounds).
    Round k runs the experiments that its report (``rounds/<k-1>/comparisons.csv``)
    names undecided (``rounds.going_on``, with the study's ``settings``: those that may
    still be decided by the cap), of those that ran the minimum (none once a round ran
    none); before that report exists, round k may run all of those of round k-1, and
    likely those that the latest report's comparisons forecast (:func:`latest_report`,
    plan/forecast.py), else the share that went on from the round before (neither known
    yet: that bound alone). (One that sat out a round and comes back, where another's
    new trials moved its comparison, is counted once a report has named it.)"""
    if most <= trials:
        return None
    records = here / "records"

    def has(e: str, k: int) -> bool:
        return (records / e / f"trial{k}.json").exists()

    def later(e: str) -> float:
        return float(per[e].get("later_seconds", per[e]["seconds"]))

    def reported(k: int) -> bool:  # round k's report: none for the last round
        return k >= most - 1 or (here / "rounds" / str(k) / "report" / "index.html").exists()

    # the experiments of the last round of the minimum (a far one or a seed's: fewer):
    # those a round may name, also after sitting one out (plan/rounds.py)
    eligible = ran = [e for e in ids if per[e].get("trials", trials) >= trials]
    latest = latest_report(here)
    known = likely = upper = reports = 0.0
    share, unknown, forecast, reports_most = None, 0, False, 0
    now, going, missing, decided = trials, 0, 0, 0
    for k in range(trials, most):
        comparisons = here / "rounds" / str(k - 1) / "comparisons.csv"
        if not unknown and comparisons.exists():
            went = rounds.going_on(comparisons, eligible if ran else [], settings, k - 1)
            share = min(1.0, len(went) / len(ran)) if ran else 0.0
            left = [e for e in went if not has(e, k)]
            known += sum(later(e) for e in left)
            decided += len(went)
            if went:
                now, going, missing = k, len(went), len(left)
                if not reported(k):
                    reports, reports_most = reports + 1, reports_most + 1
            ran = went
            continue
        # not decided yet: every one of them may go on; likely as the comparisons so
        # far forecast (plan/forecast.py), else the share that went on last time
        unknown += 1
        candidates = {e: later(e) for e in ran if not has(e, k)}
        upper += sum(candidates.values())
        report = 0 if reported(k) or not candidates else 1
        reports_most += report
        chance = _chances(latest, settings, k, ran) if latest and settings else None
        if chance:
            likely += forecast_.expected(chance, candidates, latest[2])
            reports += report * forecast_.runs_at_all(chance, candidates, latest[2])
            forecast = True
        elif share is not None:
            likely += share**unknown * sum(candidates.values())
            reports += report * (1.0 - (1.0 - share**unknown) ** len(candidates))
    return Rounds(
        known, likely, known + upper, now, most, going, missing, decided, forecast, reports,
        reports_most,
    )  # fmt: skip


def latest_report(here: Path) -> tuple[Path, int, bool] | None:
    """The comparisons of the latest round report under ``here`` (a numbered round's,
    else the latest provisional one's, plan/order.py), its round (0 for a provisional
    one) and whether it is a round's, after a trial of every experiment; None before
    any."""
    base = here / "rounds"
    numbered = []
    for path in base.glob("*/comparisons.csv"):
        if path.parent.name.isdigit():
            numbered.append((int(path.parent.name), path))
    if numbered:
        k, path = max(numbered)
        return path, k, True
    for stage in reversed(list(order.STAGES)):
        path = base / stage / "comparisons.csv"
        if path.exists():
            return path, 0, False
    return None


_forecasts: dict[tuple, dict[str, float]] = {}


def _chances(latest, settings: Mapping, k: int, ran: list[str]) -> dict[str, float]:
    """``forecast.chances`` of round ``k`` from the report ``latest``
    (:func:`latest_report`), cached by its path and modification time: a line after
    every trial costs milliseconds."""
    path, round_, _ = latest
    try:
        key = (str(path), path.stat().st_mtime_ns, k, tuple(ran), repr(sorted(settings.items())))
    except OSError:
        return {}
    if key not in _forecasts:
        try:
            rows = rounds.read_rows(path)
        except (OSError, ValueError):
            return {}
        _forecasts[key] = forecast_.chances(rows, settings, round_, k, set(ran))
    return _forecasts[key]


class After(NamedTuple):
    """What runs after (and between) the trials and is not done yet: its seconds, how
    many of it are collectives jobs, how many reports (a round's chance of running counted
    as such: :class:`Rounds`)."""

    seconds: float
    jobs: int
    reports: float
    #: one report of the whole study's size, as this study's reports measured so far
    each_report: float = estimate.REPORT_S


#: the reports' benchmarks (rules/report.smk, Snakemake's ``benchmark:``), under the
#: study's logs: the study's, and each round's or stage's by its name
REPORT_BENCHMARK = Path("benchmarks") / "report.tsv"
ROUND_BENCHMARKS = Path("benchmarks") / "rounds"


def after_trials(
    study,
    results: Path,
    logs: Path | str | None = None,
    ahead: Rounds | None = None,
    scale: float = 1.0,
) -> After:
    """The jobs that run after the trials, or between them, and are not done yet
    (:class:`After`): each collectives variant without a result (at the median wall time
    of those done, else what the study's estimate counts for one at ``scale``: the
    trials' measured over estimated, as the machine is slower or faster than the one the
    estimate was measured on), the question's stages'
    reports and the rounds' not yet written (``ahead``'s adaptive ones at their chance),
    and the study's report; each report at ``estimate.report_s`` of the experiments it
    holds, scaled as this study's reports measured so far were off (:func:`report_scale`,
    their benchmarks under ``logs``, the study's logs by default). The time left is the
    study's, not only its trials': the default study's four collectives jobs took 4 min
    after its last trial on 2 CPUs, and its eight reports about 30 s each besides."""
    missing, walls = 0, []
    for variant in (study.settings.get("collectives") or {}).get("variants") or []:
        try:
            wall = read_json(results / "collectives" / f"{variant}.json").get("process_wall_s")
        except UnreadableFile:
            missing += 1
            continue
        if finite(wall) and wall > 0:
            walls.append(float(wall))
    each = statistics.median(walls) if walls else estimate.COLLECTIVES_S * scale
    logs = Path(study.logs if logs is None else logs)
    trials, most = int(study.settings["trials"]), rounds.cap(study.settings)
    n = len(study.experiments)
    sizes = [n]  # the study's report
    for stage, ids in order.stages(study.experiments, trials).items():
        if not (results / "rounds" / stage / "report" / "index.html").exists():
            sizes.append(len(ids))
    for k in range(min(trials, most - 1)):  # the minimum's rounds' (but the last's)
        if not (results / "rounds" / str(k) / "report" / "index.html").exists():
            sizes.append(n)
    adaptive = ahead.reports if ahead else 0.0
    scale = report_scale(results, logs)
    seconds = sum(estimate.report_s(s) for s in sizes) + adaptive * estimate.report_s(n)
    return After(
        missing * each + seconds * scale, missing, len(sizes) + adaptive,
        estimate.report_s(n) * scale,
    )  # fmt: skip


def report_scale(results: Path, logs: Path) -> float:
    """How far ``estimate.report_s`` was off for this study's reports that have a
    benchmark (their wall time, against the estimate for the experiments that their
    summary holds), within :data:`RATIO_BOUNDS`; 1 without any."""
    pairs = [(logs / REPORT_BENCHMARK, results / "summary.csv")]
    for bench in sorted((logs / ROUND_BENCHMARKS).glob("*.tsv")):
        pairs.append((bench, results / "rounds" / bench.stem / "summary.csv"))
    measured = predicted = 0.0
    for bench, summary in pairs:
        wall, held = benchmark_s(bench), _experiments_in(summary)
        if wall is not None and held:
            measured += wall
            predicted += estimate.report_s(held)
    if predicted <= 0:
        return 1.0
    return min(max(measured / predicted, RATIO_BOUNDS[0]), RATIO_BOUNDS[1])


def benchmark_s(path: Path) -> float | None:
    """The wall time of a Snakemake benchmark file (its first column, ``s``, of its
    first row), None where there is none."""
    try:
        rows = path.read_text().splitlines()
        value = float(rows[1].split("\t")[0])
    except (OSError, IndexError, ValueError):
        return None
    return value if finite(value) and value >= 0 else None


_held: dict[str, tuple[int, int]] = {}


def _experiments_in(summary: Path) -> int:
    """How many experiments a report's summary.csv holds (cached by modification time);
    0 where it cannot be read."""
    try:
        mtime = summary.stat().st_mtime_ns
    except OSError:
        return 0
    hit = _held.get(str(summary))
    if hit and hit[0] == mtime:
        return hit[1]
    try:
        with open(summary, newline="") as fh:
            held = len({row.get("experiment") for row in csv.DictReader(fh)} - {None, ""})
    except (OSError, ValueError, csv.Error):
        held = 0
    _held[str(summary)] = (mtime, held)
    return held


def spread_of(ratios: list[float]) -> float:
    """The half-width (log units, about 95 %) of the mean of ``ratios``' logs; 0 with
    fewer than two."""
    logs = [math.log(r) for r in ratios if r > 0]
    if len(logs) < 2:
        return 0.0
    return 2.0 * statistics.stdev(logs) / math.sqrt(len(logs))


def _ours(t: Times, since: float | None) -> bool:
    """Whether this run wrote the record (at ``since`` or later; every one without)."""
    return since is None or (t.written is not None and t.written >= since)


def rerun_share(times: Iterable[Times], since: float | None = None) -> float:
    """The noise reruns' time per second of kept trial wall, over the trials that ended
    ok and that this run wrote (their records written at ``since`` or later; every
    record where ``since`` is None), weighed by how many they are
    (``n / (n + RERUN_PRIOR_TRIALS)``); 0 without any. An earlier sitting's reruns say
    how busy the machine was then: the default study's first sitting ended with ten
    trials in a row rerun under a neighbour's load, and its resumed sitting, which
    reran none, was told 13-17 % more for them (73 of its 95 lines beyond 1.3x the time
    it then took, 1.23-1.78x; at its own rate, 1)."""
    kept = [t for t in times if t.wall is not None and t.failed is None and _ours(t, since)]
    wall = sum(t.wall for t in kept)
    if wall <= 0:
        return 0.0
    return sum(t.retry for t in kept) / wall * len(kept) / (len(kept) + RERUN_PRIOR_TRIALS)


def efficiency(times: Iterable[Times], elapsed: float, since: float | None = None) -> str:
    """The study's measurement efficiency: its trials' warm-up and timed steps (the first
    step at a steady step's time) over the trials' wall time, and the timed steps' share;
    then the warm-up and timed steps of the trials this run wrote (their records written
    at ``since`` or later; every record where ``since`` is None) over this run's elapsed
    time, where this run wrote any; "" where no record says."""
    times = list(times)
    ours = [t for t in times if _ours(t, since)]
    this_run = sum(t.measuring for t in ours if t.measuring is not None)
    measuring = sum(t.measuring for t in times if t.measuring is not None)
    timed = sum(t.timed for t in times if t.timed is not None)
    wall = sum((t.wall or 0.0) + t.retry for t in times)
    retries = sum(t.retry for t in times)
    if measuring <= 0 or wall <= 0:
        return ""
    text = (
        f"; measuring {100 * measuring / wall:.0f}% of the trials' wall time "
        f"({estimate_text.human(measuring)} of {estimate_text.human(wall)} in warm-up and "
        f"timed steps, {100 * timed / wall:.0f}% in the timed steps"
    )
    if retries > 0:
        text += f"; noise reruns {estimate_text.human(retries)}, {100 * retries / wall:.0f}%"
    if elapsed > 0 and this_run > 0:
        text += f"), {100 * this_run / elapsed:.0f}% of this run's"
    else:
        text += ")"
    return text


def line(
    study,
    results: Path | str = "results",
    started: float | None = None,
    now: float | None = None,
    machine: estimate.Machine | None = None,
    reserve_s: float = 0.0,
    logs: Path | str | None = None,
) -> str:
    """One progress line for a loaded study (``study.Study``). ``reserve_s``: a budget's
    reserve not yet planned (study/replan.py): the estimate of its trials, which the plan
    made after the first trials fits into what is left of the budget. ``logs``: where
    the reports' benchmarks are (:func:`after_trials`; the study's logs by default)."""
    from . import preflight

    results = Path(results)
    here = preflight.under(results, study.settings)  # (a pre-flight's results apart)
    trials = int(study.settings["trials"])
    most = rounds.cap(study.settings)
    experiments = study.experiments
    # every trial measured, the adaptive rounds' too (each says how far the estimate is off)
    done, times = measure(experiments, most, here)
    minimum = [(e, k) for e, k in done if k < trials]
    # each trial without its noise reruns: a rerun is not extrapolated to the whole study;
    # nor is a trial that did not end ok (a failure after seconds where an hour was
    # predicted says nothing of the others), whose experiment's trials yet to run are
    # predicted at its own wall time instead (its last trial's)
    walls = ok_walls(times)
    failed: dict[str, float] = {}
    for (e, _), t in sorted(times.items(), key=lambda item: item[0][1]):
        if t.failed is None:
            failed.pop(e, None)
        else:
            failed[e] = t.failed
    if machine is None:
        machine = study_estimate.study_machine(study, results, measure=False)
    records = here / "records"
    first_done = [e for e, k in done if k == 0]
    far_known = {e: (rounds.far_first(records, e) or (0.0,))[0] for e in first_done}
    est = study_estimate.total(
        experiments,
        trials,
        machine,
        setup=study_estimate.Setup(study.envs),
        known=study_estimate.Known(minimum, far_known, failed),
        margin=float(study.settings.get("margin", 0.03)),
    )
    # the same estimate's prediction for the trials done, against their wall time
    per = est["experiments"]

    def predicted(e: str, k: int) -> float:
        return per[e]["seconds"] if k == 0 else per[e].get("later_seconds", per[e]["seconds"])

    # each trial left at its group's ratio where its group's trials say (the run's
    # otherwise): the trials of the minimum left, else the rounds' (later trials of the
    # experiments that may go on)
    group_of = groups_of(experiments)
    speed = speed_of(walls, predicted, group_of)
    run = speed.run
    finished = set(done)
    left_trials = [
        (e, k, predicted(e, k))
        for e, p in per.items()
        for k in range(int(p.get("trials", trials)))
        if (e, k) not in finished and not (k and e in failed)
    ]
    if not left_trials:
        left_trials = [
            (e, 1, predicted(e, 1)) for e, p in per.items() if p.get("trials", 0) >= trials
        ]
    ratio = speed.ahead(left_trials, group_of)
    # the rounds' trials each at its experiment's own ratio (its group's where it has no
    # later trial yet), stated at the line's
    rounds_per = {
        e: {**p, "later_seconds": predicted(e, 1) * speed.of_trial(e, 1, group_of) / ratio}
        for e, p in per.items()
    }
    ahead = rounds_ahead(study.ids, rounds_per, here, trials, most, study.settings)
    total = est["planned_trials"] + (ahead.decided if ahead else 0)
    began = started if started is not None else started_at()
    elapsed = (now if now is not None else time.time()) - began
    text = (
        f"[progress] {len(done)} of {total} trials have a record, {estimate_text.human(elapsed)} "
    )
    text += "elapsed in this run"
    text += first_answer(here, elapsed, now)
    left = est["remaining_trials_s"]
    # (the failures' repeats are measured times: not scaled)
    repeats = est["remaining_repeats_s"]
    # (collectives jobs not yet run at the trials' ratio: 40-65 s each on a 2-vCPU Xeon
    # whose trials took 1.3-1.4x their estimates, against the estimate's 30 s)
    after, jobs, reports, each_report = after_trials(study, here, logs, ahead, run)
    # every round going on to the cap writes the reports that its chance counts in part
    most_reports = (ahead.reports_most - ahead.reports) * each_report if ahead else 0.0
    reruns = rerun_share(times.values(), began)

    def scaled(by: float, more: float = 0.0) -> float:
        """The trials left (and ``more`` estimated seconds of the rounds') at ``by``."""
        return (left - repeats + more) * by * (1.0 + reruns) + repeats + after

    then = _then_text(after, jobs, reports)
    if len(minimum) >= est["planned_trials"]:
        text += efficiency(times.values(), elapsed, began)
        if ahead is None or ahead.most <= 0:
            return text + "; every trial is done" + then
        if ahead.known <= 0 and ahead.decided == 0:
            return (
                text + f"; the {est['planned_trials']} trials of the minimum are done: more (up to "
                f"{most} each) only where a comparison is still undecided or the headline's "
                f"is not yet within the margin, up to about "
                f"{estimate_text.human(scaled(ratio, ahead.most) + most_reports)} more" + then
            )
        return text + _rounds_text(ahead, scaled, ratio, reruns, then, most_reports, run)
    missing = est["planned_trials"] - len(minimum)
    trials_left = f"{missing} trial{'' if missing == 1 else 's'} without a record"
    noise = (f", and {100 * reruns:.0f}% more for noise reruns at this run's rate"
             if reruns >= 0.005 else "")  # fmt: skip
    rounds_then, rounds_in = "", ""
    # the rounds as the comparisons so far forecast them (plan/forecast.py), in the time
    # left; without a forecast, only their bound beside it
    forecast = ahead.likely if ahead and ahead.forecast else 0.0
    if ahead and ahead.most > 0:
        more = estimate_text.human(
            scaled(ratio, ahead.most) - scaled(ratio, forecast) + most_reports
        )
        if ahead.forecast:
            rounds_in = (f" and of {estimate_text.human(forecast)} for the adaptive rounds, as "
                         "the comparisons so far forecast them")  # fmt: skip
            rounds_then = f"; up to about {more} more if every experiment goes on to {most} trials"
        else:
            rounds_then = (
                f"; the adaptive rounds then up to about {more} more, where comparisons stay "
                "undecided"
            )
    if sum(predicted(e, k) for e, k in walls) > 0:
        # how sure that ratio is, from how much the trials' own ratios vary: a range
        # where the trials so far disagree (few of them, or unlike ones)
        half = spread_of([w / predicted(e, k) for (e, k), w in walls.items() if predicted(e, k)])
        span = ""
        if half > math.log(RANGE_FROM):
            low = min(max(ratio * math.exp(-half), RATIO_BOUNDS[0]), RATIO_BOUNDS[1])
            high = min(max(ratio * math.exp(half), RATIO_BOUNDS[0]), RATIO_BOUNDS[1])
            span = (f", {estimate_text.human(scaled(low, forecast))} to "
                    f"{estimate_text.human(scaled(high, forecast))}")  # fmt: skip
        guess = scaled(ratio, forecast)
        until = clock.deadline()
        if reserve_s > 0 and until:  # the reserve: what fits of it, up to the budget's end
            upto = until - (now if now is not None else time.time())
            guess = max(guess, min(scaled(ratio, reserve_s + forecast), upto))
            span = ""
            rounds_then += (
                f"; then, planned again after the first trials, what fits of the budget's "
                f"reserve (about {estimate_text.human(scaled(ratio, reserve_s) - scaled(ratio))}"
                f" for all of it), the budget ending at "
                f"{time.strftime('%H:%M', time.localtime(until))}"
            )
        held = held_by_clock(guess, after, here / "records", now)
        if held < guess:  # (the trials that it leaves out are not in the time left)
            guess, span = held, ""
            rounds_then += (
                "; no more: the budget's clock leaves out the trials that would end too late "
                f"for what follows them ({time.strftime('%H:%M', time.localtime(until))})"
            )
        return (
            text + f"; about {estimate_text.human(guess)} left{span} (the "
            f"estimate of {estimate_text.human(left)} for the {trials_left}{rounds_in}, "
            f"x {ratio:.2f}: measured/estimated so far{_by_group(ratio, run)}, noise reruns "
            f"left out{noise}{then})" + rounds_then
        )
    return (
        text
        + (
            f"; about {estimate_text.human(left + after)} left (the estimate, nothing measured "
            f"yet{then})"
        )
        + rounds_then
    )


def held_by_clock(left_s: float, after_s: float, records: Path, now: float | None = None) -> float:
    """The time left ``left_s`` (of which ``after_s`` runs after the trials) as a budget's
    clock holds it (plan/clock.py): the trials' part no longer than it lets trials run,
    to the deadline less the time it keeps after them, both at the scale it applies
    (this study's trials against their own estimates, under ``records``); ``left_s``
    itself without a budget. (Without it, the last lines of a budget=1h default study
    counted 4 trials the clock then left out: 1.3-1.6x the time then left.)"""
    until = clock.deadline()
    if until is None:
        return left_s
    room = until - (time.time() if now is None else now) - clock.kept(clock.ratio(records))
    return min(left_s, max(0.0, room) + after_s)


def _by_group(ratio: float, run: float | None) -> str:
    """What the line says where the trials ahead are not at the run's ratio ``run``
    (their groups' own: :func:`group_ratios`)."""
    if run is None or f"{ratio:.2f}" == f"{run:.2f}":
        return ""
    return f" by group (the run's {run:.2f})"


def _then_text(after: float, jobs: int, reports: float) -> str:
    """What the line says of the jobs besides the trials still to run (:class:`After`):
    the collectives jobs and the reports (nothing where the study's report alone is
    left)."""
    count = round(reports)
    if not jobs and count <= 1:
        return ""
    what = "the report" if count <= 1 else f"{count} reports"
    if jobs:
        what = f"the {jobs} collectives job{'' if jobs == 1 else 's'} and {what}"
    return f"; then about {estimate_text.human(after)} for {what}"


def _rounds_text(
    ahead: Rounds, scaled, ratio: float, reruns: float, then: str, most_reports: float = 0.0,
    run: float | None = None,
) -> str:  # fmt: skip
    """The adaptive rounds' part of the line, once the minimum is done (``scaled``: the
    line's, ``then``: what runs after the trials, ``most_reports``: the reports the
    rounds write at most beyond those their chances count)."""
    if ahead.missing <= 0 and ahead.most - ahead.known <= 0:
        return "; every trial is done: the rounds have ended" + then
    guess = scaled(ratio, ahead.known + ahead.likely)
    upper = scaled(ratio, ahead.most) + most_reports
    span = (f", up to {estimate_text.human(upper)} if every one goes on to {ahead.cap} trials"
            if upper > guess * RANGE_FROM else "")  # fmt: skip
    noise = (f", and {100 * reruns:.0f}% more for noise reruns at this run's rate"
             if reruns >= 0.005 else "")  # fmt: skip
    plural = "" if ahead.missing == 1 else "s"
    where = (
        f"; adaptive round {ahead.round} (trial {ahead.round + 1} of up to {ahead.cap} each): "
        f"{ahead.going} experiments still undecided, {ahead.missing} trial{plural} without "
        "a record"
        if ahead.missing > 0
        else f"; adaptive round {ahead.round} done ({ahead.going} experiments): the next only "
        "where a comparison is still undecided"
    )
    return (
        f"{where}; about {estimate_text.human(guess)} left{span} (x {ratio:.2f}: "
        f"measured/estimated so far{_by_group(ratio, run)}, noise reruns left out{noise}{then})"
    )


def report(study, results: Path | str = "results", reserve_s: float = 0.0) -> None:
    """Print the progress line after a trial's job (a rule's ``run:`` block); a line
    that cannot be made never fails the job."""
    import sys

    try:
        text = line(study, results, reserve_s=reserve_s)
    except Exception as exc:  # noqa: BLE001 - progress is advice, not a result
        text = f"[progress] none: {type(exc).__name__}: {exc}"
    print(text, file=sys.stderr, flush=True)
