"""What the warm-up steps after the first bought, over a finished study's records
(``metrics.warmup_step_times_s``: each warm-up step's time, the first paying the run's
one-off costs): for each trial that ran two or more, its last warm-up step against its
own timed steps, i.e. whether that step was already as long as a steady one (and so could
have been timed) or was still settling. By kind (a run that compiles in its steps or
not: ``schedule.compiles_in_steps``) and by trial (a first trial, which pays cold
compiles and the gradient check, or a later one), with the seconds those steps took;
and, by kind over the trials of three or more timed steps, the share of a trial's timed
steps faster than its last warm-up step (0.5 on average were that step one like them),
beside the same share for its first timed step against the timed steps after it.

    .venv/bin/python tests/benchmarks/warmup_steps.py results/records
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.benchmarks.trial_costs import records  # noqa: E402
from workflow_scripts.rank import schedule  # noqa: E402


def last_warmup(record: dict) -> dict | None:
    """The trial's last warm-up step against its timed steps (None: fewer than two
    warm-up steps, or fewer than two timed steps)."""
    metrics = record.get("metrics") or {}
    warm, timed = metrics.get("warmup_step_times_s") or [], record.get("step_times_s") or []
    if len(warm) < 2 or len(timed) < 2 or record.get("status") != "ok":
        return None
    median = statistics.median(timed)
    return {
        "kind": "compiles" if schedule.compiles_in_steps(record["spec"]) else "eager",
        "trial": "first" if record.get("trial", 0) == 0 else "later",
        "ratio": warm[-1] / median,  # the last warm-up step, in the timed steps' median
        "widest": max(timed) / median,  # the slowest timed step, the same way
        "within": min(timed) <= warm[-1] <= max(timed),
        # (three or more timed steps) the share of them faster than the last warm-up
        # step, and of those after the first timed step faster than it
        "faster": sum(t < warm[-1] for t in timed) / len(timed) if len(timed) > 2 else None,
        "first_faster": (
            sum(t < timed[0] for t in timed[1:]) / (len(timed) - 1) if len(timed) > 2 else None
        ),
        "after_first_s": sum(warm[1:]),
        "warmup_s": sum(warm),
        "wall_s": record.get("trial_wall_s") or 0.0,
    }


def spread(values: list[float]) -> str:
    """min / p10 / median / p90 / max."""
    if len(values) < 2:
        return " ".join(f"{v:.3f}" for v in values)
    q = statistics.quantiles(values, n=10, method="inclusive")
    points = (min(values), q[0], statistics.median(values), q[-1], max(values))
    return " / ".join(f"{v:.3f}" for v in points)


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__)
        return 2
    found = [r for folder in argv for r in records(Path(folder))]
    rows = [row for r in found if (row := last_warmup(r))]
    print(f"{len(found)} records; {len(rows)} ok with 2+ warm-up steps and 2+ timed steps")
    print("ratios to the trial's median timed step: min / p10 / median / p90 / max")
    for kind in ("eager", "compiles"):
        for trial in ("first", "later"):
            group = [r for r in rows if r["kind"] == kind and r["trial"] == trial]
            if not group:
                continue
            within = sum(r["within"] for r in group)
            warm = sum(r["warmup_s"] for r in group)
            after = sum(r["after_first_s"] for r in group)
            print(f"  {kind} runs, {trial} trials: {len(group)}")
            print(f"    last warm-up step   {spread([r['ratio'] for r in group])}")
            print(f"    slowest timed step  {spread([r['widest'] for r in group])}")
            print(f"    last warm-up step within the timed steps' range: {within}")
            print(f"    warm-up {warm:.0f} s, after the first step {after:.0f} s,"
                  f" of {sum(r['wall_s'] for r in group):.0f} s of their trials' wall")  # fmt: skip
    for kind in ("eager", "compiles"):
        group = [r for r in rows if r["kind"] == kind and r["faster"] is not None]
        if group:
            mean = statistics.mean(r["faster"] for r in group)
            first = statistics.mean(r["first_faster"] for r in group)
            slowest = sum(r["faster"] == 1.0 for r in group)
            print(f"  {kind} runs, {len(group)} trials of 3+ timed steps: timed steps faster than"
                  f" the last warm-up step {mean:.2f} on average (slower than all in {slowest});"
                  f" later timed steps faster than the first {first:.2f}")  # fmt: skip
    total = sum((r.get("trial_wall_s") or 0) for r in found)
    after = sum(r["after_first_s"] for r in rows)
    print(f"warm-up steps after the first: {after:.0f} s of {total:.0f} s of trial wall")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
