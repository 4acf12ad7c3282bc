"""Far from its baseline: a trial that stops timing once its first timed steps put it
beyond ``far_stop`` times its baseline's speed, either way.

A rung 20x slower than the run it is compared with (bf16 where it is emulated) is as
certain of that after two timed steps as after eight, and after one trial as after
two. Its baseline is its group's first experiment when both time the same work per
step (same workload, batch, ranks and nodes; not an epochs run): that experiment's
first trial's record is the trial's ``ancient`` input (a rerun of it reruns nothing
else). The rank (``rank/harness.py``) stops when the 95 % interval of its mean step
time, from at least 2 timed steps, lies wholly beyond the factor; the record says so
(``stop_reason: far_from_baseline``, ``far_from``: the baseline, its trial and step
time, the factor), and the experiment runs no other trial (``plan/rounds.py``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from pathlib import Path

from ..study.fields import compare_keys
from ..util import read_json

#: the spec key that hands the rank its baseline's step time (the record's own key)
SPEC_KEY = "far_from"
#: what must match for two experiments' step times to be comparable (a launcher, an
#: allocator or a backend changes how fast the step runs, not what it computes)
SAME_WORK = (*compare_keys("workload"), "batch_size", "ranks", "nodes")


def baseline_of(spec: Mapping, specs: Iterable[Mapping]) -> str | None:
    """The experiment whose first trial a trial of ``spec`` may measure itself against:
    its group's first; None when ``far_stop`` is off, for an epochs run, or for the
    group's first itself. Whether the two time the same work per step is the trial's
    to tell (:func:`reference`), so that editing the group's first reruns no other
    experiment (the set of a trial's inputs stays the same)."""
    if not spec.get("far_stop") or spec.get("epochs"):
        return None
    first = next((s for s in specs if s.get("group") == spec.get("group")), None)
    if first is None or first["id"] == spec["id"]:
        return None
    return str(first["id"])


def same_work(a: Mapping, b: Mapping) -> bool:
    """Whether two specs time the same work per step (not an epochs run)."""
    if a.get("epochs") or b.get("epochs"):
        return False
    return all(a.get(k) == b.get(k) for k in SAME_WORK)


def reference(path: Path | str | None, spec: Mapping) -> dict | None:
    """What the rank compares its steps with: the baseline record's median step time
    (an ok record of the same work per step with one; None otherwise: no early stop)."""
    if not path or not spec.get("far_stop"):
        return None
    try:
        record = read_json(Path(path), want=None)
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("status") != "ok":
        return None
    if not isinstance(record.get("spec"), dict) or not same_work(record["spec"], spec):
        return None
    step = ((record.get("metrics") or {}).get("step_time_s") or {}).get("median")
    if not isinstance(step, (int, float)) or not math.isfinite(step) or step <= 0:
        return None
    return {
        "baseline": (record.get("spec") or {}).get("id"),
        "trial": record.get("trial", 0),
        "step_time_s": step,
        "factor": float(spec["far_stop"]),
    }
