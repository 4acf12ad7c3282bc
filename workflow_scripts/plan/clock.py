"""The budget's clock: ``--config budget=1h`` plans what fits before anything runs
(``study/entry.py``: the adaptive rounds capped, the question first, the rest left out
where even two trials of everything do not fit), and the clock holds the study to it
where that plan, an estimate, was wrong.

Snakemake's process starts the clock (:func:`start`: the deadline, its start plus the
budget, in :data:`DEADLINE_VAR`, which every job's process inherits) and keeps time at
its end for what the study runs after its last trial (:func:`keep_after`: the collectives
jobs and the study's report, as the plan estimates them, in :data:`AFTER_VAR`, and the
least it keeps whatever the scale, in :data:`LEAST_VAR`). A trial that would end past
the deadline with that time still to follow (now plus its own estimate scaled as this
study's trials so far took against their estimates, :func:`ratio`, and the time kept,
:func:`kept`: the estimate at the same scale, at least the least; :func:`too_late`)
does not start: its record says so (status :data:`LEFT_OUT`, kind :data:`KIND`), and the
study goes on to its report with what ran. (Without the time kept, a budget=1h default
study on a 2-vCPU Xeon ran its last trial up to the deadline and its four collectives
jobs and report 2.6 min past it; with the least scaled too, its next run kept 7.2 min
for 3 min of them and left out 4 trials it had time for.)
No noise rerun starts past it either (the attempt is kept, flagged). The next
``snakemake`` forgets those records before it plans (:func:`forget`): what the clock
left out runs then, and nothing else reruns. Standard library only.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from ..util import finite, read_json

#: the study's deadline (seconds since the epoch), for every job's process
DEADLINE_VAR = "STUDY_DEADLINE"
#: what the study runs after its last trial (seconds, as estimated), for every job's process
AFTER_VAR = "STUDY_AFTER_TRIALS_S"
#: ... and the least kept for it, whatever the trials' scale (seconds)
LEAST_VAR = "STUDY_AFTER_TRIALS_LEAST_S"
#: the least and most a trial's estimate is scaled by what this study's trials took
RATIO_BOUNDS = (0.2, 5.0)
#: the status of a trial the clock left out (a record, never a failure)
LEFT_OUT = "left_out"
#: its error kind
KIND = "OverBudget"


def start(budget_s: float, now: float | None = None) -> float:
    """Start the clock: the deadline, ``budget_s`` from now, for every job's process."""
    deadline = (time.time() if now is None else now) + float(budget_s)
    os.environ[DEADLINE_VAR] = f"{deadline:.3f}"
    return deadline


def deadline() -> float | None:
    """The study's deadline, or None (no budget, or none readable)."""
    try:
        return float(os.environ[DEADLINE_VAR])
    except (KeyError, ValueError):
        return None


def keep_after(seconds: float, least: float = 0.0) -> None:
    """Keep time at the deadline's end for what the study runs after its last trial (the
    collectives jobs, the study's report), for every job's process: ``seconds`` as
    estimated (scaled as the trials, :func:`kept`), at least ``least``."""
    os.environ[AFTER_VAR] = f"{max(0.0, float(seconds)):.1f}"
    os.environ[LEAST_VAR] = f"{max(0.0, float(least)):.1f}"


def _seconds(var: str) -> float:
    try:
        seconds = float(os.environ[var])
    except (KeyError, ValueError):
        return 0.0
    return seconds if finite(seconds) and seconds > 0 else 0.0


def after() -> float:
    """The estimate of what runs after the last trial (0: none kept)."""
    return _seconds(AFTER_VAR)


def least() -> float:
    """The least kept for what runs after the last trial, whatever the scale (0: none)."""
    return _seconds(LEAST_VAR)


def kept(scale: float = 1.0) -> float:
    """The seconds kept at the deadline's end: the estimate (:func:`after`) at ``scale``,
    at least :func:`least` (the most the collectives jobs took on the machines measured:
    scaled again, it kept 7.2 min for 3 min of them on a machine 1.46x its estimates)."""
    return max(least(), after() * max(0.0, float(scale)))


def ratio(records: Path | str) -> float:
    """How this study's trials so far took against their own estimates: over the records
    under ``records`` (``<id>/trial<k>.json``) that ended ok, their wall time without
    noise reruns over the estimate each record holds, within :data:`RATIO_BOUNDS`; 1
    where none says."""
    measured = estimated = 0.0
    for path in Path(records).glob("*/trial*.json"):
        try:
            record = read_json(path, want=None)
        except (OSError, ValueError):
            continue
        if not isinstance(record, dict) or record.get("status") != "ok":
            continue
        wall, retry = record.get("trial_wall_s"), record.get("retry_wall_s")
        est = (record.get("estimate") or {}).get("seconds")
        wall = wall - (retry if finite(retry) and retry > 0 else 0.0) if finite(wall) else 0
        if wall > 0 and finite(est) and est > 0:
            measured += wall
            estimated += est
    if estimated <= 0:
        return 1.0
    return min(max(measured / estimated, RATIO_BOUNDS[0]), RATIO_BOUNDS[1])


def too_late(
    expected_s: float,
    now: float | None = None,
    until: float | None = None,
    after_s: float | None = None,
    scale: float = 1.0,
) -> bool:
    """Whether a trial expected to take ``expected_s`` (at ``scale``: :func:`ratio`) would
    end past the deadline with ``after_s`` (by default :func:`kept` at that scale) still
    to run after it."""
    until = deadline() if until is None else until
    if until is None:
        return False
    held = kept(scale) if after_s is None else max(0.0, float(after_s))
    ahead = max(0.0, float(expected_s)) * float(scale) + held
    return (time.time() if now is None else now) + ahead > until


def why(expected_s: float, until: float, after_s: float = 0.0, scale: float = 1.0) -> str:
    """A left-out trial's message (``after_s``: the seconds kept, :func:`kept`)."""
    late = time.strftime("%H:%M:%S", time.localtime(until))
    scaled = ""
    if f"{scale:.2f}" != "1.00":
        scaled = f", x {scale:.2f} as this study's trials took against their estimates"
    then = ""
    if after_s > 0:
        then = (f", and the {after_s:.0f} s kept for what the study runs after its trials "
                "(the collectives jobs, the report),")  # fmt: skip
    return (
        f"the budget's clock ran out: this trial, about {expected_s:.0f} s by the "
        f"estimate{scaled}{then} would end past the study's deadline ({late}); left out, it "
        "runs on the next snakemake (give a larger budget, or none)"
    )


def forget(records: Path | str, summary: Path | str | None = None) -> list[Path]:
    """Remove the records the clock left out under ``records`` (``<id>/trial<k>.json``),
    so that this invocation runs those trials; the removed paths. Where it removes one,
    it removes ``summary`` too (the report's): Snakemake does not run a job again for
    a missing input whose consumer is up to date, but for a missing output it does,
    and then the inputs it lacks."""
    gone = []
    for path in sorted(Path(records).glob("*/trial*.json")):
        try:
            status = read_json(path, want=None).get("status")
        except (OSError, ValueError, AttributeError):
            continue
        if status == LEFT_OUT:
            path.unlink(missing_ok=True)
            gone.append(path)
    if gone and summary is not None:
        Path(summary).unlink(missing_ok=True)
    return gone
