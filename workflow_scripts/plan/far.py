"""Far from its baseline: a trial that stops timing once its first timed steps put it
beyond ``far_stop`` times its baseline's speed, either way.

A rung 20x slower than the run it is compared with (bf16 where it is emulated) is as
certain of that after two timed steps as after eight, and after one trial as after
two. Its baseline is the first run listed before it in its group that times the same
work per step (same workload, batch, ranks and nodes; not an epochs run): bf16 GPT-2
against fp32 GPT-2, a served BERT-base at batch 16 against eager BERT-base at batch 16.
Which run that is depends on the other runs' settings, so a trial does not take that
run's record as its input: it takes its own far pointer (``results/far/<id>.json``,
written by the ``far_baseline`` rule from the baseline's first trial's record, an
``ancient`` input) and follows it. Editing another run reruns that bookkeeping, never
the trial (the set of a trial's inputs stays the same). The rank
(``rank/harness.py``) stops when the 95 % interval of its mean step time, from at least
2 timed steps, lies wholly beyond the factor; the record says so (``stop_reason:
far_from_baseline``, ``far_from``: the baseline, its trial and step time, the factor),
and where that is slower by the factor squared the experiment runs no other trial
(``plan/rounds.py``: between the factor and its square, a disturbed process may be
the cause, and its second trial is another draw).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from ..spec.fields import compare_keys
from ..util import read_json, write_json_atomic

#: what must match for two experiments' step times to be comparable (a launcher, an
#: allocator or a backend changes how fast the step runs, not what it computes)
SAME_WORK = (*compare_keys("workload"), "batch_size", "ranks", "nodes")


def baseline_of(spec: Mapping, specs: Sequence[Mapping]) -> str | None:
    """The experiment whose first trial a trial of ``spec`` measures itself against: the
    first one listed before it in its group that times the same work per step; None
    when ``far_stop`` is off, for an epochs run, or where no earlier run of the group
    does the same work."""
    if not has_pointer(spec, specs):
        return None
    for other in specs:
        if other["id"] == spec["id"]:
            return None
        if other.get("group") == spec.get("group") and same_work(other, spec):
            return str(other["id"])
    return None


def has_pointer(spec: Mapping, specs: Sequence[Mapping]) -> bool:
    """Whether a trial of ``spec`` reads a far pointer: ``far_stop`` on, not an epochs
    run, and not its group's first (whatever the other runs' settings are)."""
    if not spec.get("far_stop") or spec.get("epochs"):
        return False
    first = next((s for s in specs if s.get("group") == spec.get("group")), None)
    return first is not None and first["id"] != spec["id"]


def write_pointer(
    path: Path | str,
    experiment: str,
    baseline: str | None,
    record: str | None,
    log: Path | str | None = None,
) -> None:
    """The far pointer of ``experiment``: its baseline and that one's first trial's
    record (relative to the pointer's folder), or none; ``log``: a line that says which."""
    path = Path(path)
    data: dict = {"experiment": experiment, "baseline": baseline or None, "record": None}
    if baseline and record:
        data["record"] = os.path.relpath(Path(record).resolve(), path.parent.resolve())
    else:
        data["why"] = "no earlier run of its group times the same work per step"
    write_json_atomic(path, data)
    if log:
        Path(log).parent.mkdir(parents=True, exist_ok=True)
        said = f"{baseline}'s first trial" if data["record"] else f"none: {data.get('why')}"
        Path(log).write_text(f"[far] {experiment} stops early against {said}\n")


def _followed(path: Path) -> dict | None:
    """The record at ``path``, or the one the far pointer at ``path`` points to."""
    try:
        data = read_json(path, want=None)
        if isinstance(data, dict) and "status" not in data and "record" in data:
            if not data["record"]:
                return None
            data = read_json(path.parent / str(data["record"]), want=None)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def same_work(a: Mapping, b: Mapping) -> bool:
    """Whether two specs time the same work per step (not an epochs run)."""
    if a.get("epochs") or b.get("epochs"):
        return False
    return all(a.get(k) == b.get(k) for k in SAME_WORK)


def reference(path: Path | str | None, spec: Mapping) -> dict | None:
    """What the rank compares its steps with: the baseline record's median step time
    (``path``: the record, or a far pointer to it; an ok record of the same work per
    step with one; None otherwise: no early stop)."""
    if not path or not spec.get("far_stop"):
        return None
    record = _followed(Path(path))
    if record is None or record.get("status") != "ok":
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
