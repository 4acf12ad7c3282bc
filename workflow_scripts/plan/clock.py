"""The budget's clock: ``--config budget=1h`` plans what fits before anything runs
(``study/entry.py``: the adaptive rounds capped, the question first, the rest left out
where even two trials of everything do not fit), and the clock holds the study to it
where that plan, an estimate, was wrong.

Snakemake's process starts the clock (:func:`start`: the deadline, its start plus the
budget, in :data:`DEADLINE_VAR`, which every job's process inherits). A trial that
would end past it (now plus its own estimate, :func:`too_late`) does not start: its
record says so (status :data:`LEFT_OUT`, kind :data:`KIND`), and the study goes on to
its report with what ran. No noise rerun starts past it either (the attempt is kept,
flagged). The next ``snakemake`` forgets those records before it plans
(:func:`forget`): what the clock left out runs then, and nothing else reruns.
Standard library only.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from ..util import read_json

#: the study's deadline (seconds since the epoch), for every job's process
DEADLINE_VAR = "STUDY_DEADLINE"
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


def too_late(expected_s: float, now: float | None = None, until: float | None = None) -> bool:
    """Whether a trial expected to take ``expected_s`` would end past the deadline."""
    until = deadline() if until is None else until
    if until is None:
        return False
    return (time.time() if now is None else now) + max(0.0, float(expected_s)) > until


def why(expected_s: float, until: float) -> str:
    """A left-out trial's message."""
    late = time.strftime("%H:%M:%S", time.localtime(until))
    return (
        f"the budget's clock ran out: this trial, about {expected_s:.0f} s by the estimate, "
        f"would end past the study's deadline ({late}); left out, it runs on the next "
        "snakemake (give a larger budget, or none)"
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
