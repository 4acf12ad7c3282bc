"""Where a comparison's uncertainty is: the between-trial spread of an experiment's
throughput when each trial had timed only its first n steps.

Reads the trial records of one or more finished studies (``results/records``), keeps
the ok ones, and for each n prints the SD of log throughput between the trials of an
experiment (pooled over the experiments with two trials or more) and the median
within-trial step CV; then whether the first timed steps drift (their mean against the
next ones'). If the between-trial SD hardly changes with n, more steps per trial buy
nothing and trials (processes) are where the time should go (docs/measurement.md,
"Measured until known, then stopped").

    python tests/benchmarks/steps_spread.py results/records [more/records ...] [--steps 3 4 8 30]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from pathlib import Path


def trials_by_experiment(records: Path) -> dict[str, list[list[float]]]:
    """Each experiment's ok trials' timed step times."""
    out: dict[str, list[list[float]]] = {}
    for path in sorted(records.glob("*/trial*.json")):
        record = json.loads(path.read_text())
        if record.get("status") == "ok" and record.get("step_times_s"):
            out.setdefault(record["spec"]["id"], []).append(record["step_times_s"])
    return out


def spread_from_first(trials: dict[str, list[list[float]]], n: int) -> tuple[float, int, float]:
    """(pooled between-trial SD of log throughput from each trial's first n steps, its
    degrees of freedom, median within-trial step CV of those steps)."""
    sum_sq, df, cvs = 0.0, 0, []
    for runs in trials.values():
        logs = [-math.log(sum(t[:n]) / n) for t in runs if len(t) >= n]
        if len(logs) > 1:
            sum_sq += statistics.variance(logs) * (len(logs) - 1)
            df += len(logs) - 1
        cvs += [statistics.stdev(t[:n]) / statistics.mean(t[:n]) for t in runs if len(t) >= n]
    sd = math.sqrt(sum_sq / df) if df else math.nan
    return sd, df, statistics.median(cvs) if cvs else math.nan


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("records", nargs="+", type=Path)
    parser.add_argument("--steps", nargs="+", type=int, default=[3, 4, 5, 8, 15, 30])
    args = parser.parse_args(argv)
    for records in args.records:
        trials = trials_by_experiment(records)
        counts = {e: len(v) for e, v in trials.items()}
        print(f"{records}: trials {counts}")
        for n in args.steps:
            sd, df, cv = spread_from_first(trials, n)
            if df:
                print(f"  first {n:2d} timed steps: between-trial SD of log throughput "
                      f"{sd:.4f} (df {df}); within-trial step CV, median {cv:.4f}")  # fmt: skip
        drift = [
            statistics.mean(t[:4]) / statistics.mean(t[4:8])
            for runs in trials.values()
            for t in runs
            if len(t) >= 8
        ]
        if drift:
            print(f"  mean of timed steps 1-4 over 5-8: median {statistics.median(drift):.4f} "
                  f"(min {min(drift):.3f}, max {max(drift):.3f}, {len(drift)} trials)")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
