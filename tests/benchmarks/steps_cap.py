"""What a lower cap on the timed steps would have changed in a finished study: its
records cut to their first N timed steps (a run whose ``steps`` was the study's cap,
not an epochs run, nor a run with a cap of its own, e.g. batch-1 serving's 100), its
throughput scaled to the mean of the steps kept, then its report's comparisons made
again (``report.build_report``, the study's looks) and set beside those of the records
as they ran: the timed steps' time saved, the comparisons decided, their intervals'
median width, the verdicts that change and how far the ratios move.

The trials are the ones the study ran: with fewer steps its adaptive rounds might have
run others. Run on one study, this says what that study's trials held, not what
another machine's will.

    .venv/bin/python tests/benchmarks/steps_cap.py results/records --cap 6 5 4 3
"""

from __future__ import annotations

import argparse
import copy
import math
import statistics
import sys
import tempfile
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.benchmarks.trial_costs import records  # noqa: E402
from workflow_scripts.report import Options, Outputs, build_report  # noqa: E402

DECIDED = ("faster", "slower", "the same")
KEY = ["kind", "baseline", "experiment"]


def cut(record: dict, cap: int, study_cap: int) -> tuple[dict, float]:
    """``record`` with its timed steps cut to the first ``cap`` (where it ran under the
    study's cap ``study_cap`` and timed more), and the seconds of steps cut."""
    spec = record.get("spec") or {}
    steps = record.get("step_times_s") or []
    metrics = record.get("metrics") or {}
    if spec.get("steps") != study_cap or spec.get("epochs") or len(steps) <= cap:
        return record, 0.0
    if not metrics.get("samples_per_s"):
        return record, 0.0
    out = copy.deepcopy(record)
    m, kept = out["metrics"], steps[:cap]
    scale = statistics.fmean(steps) / statistics.fmean(kept)
    for key in ("samples_per_s", "achieved_gflops", "pct_of_peak"):
        if isinstance(m.get(key), (int, float)):
            m[key] *= scale
    out["step_times_s"], m["steps_timed"] = kept, cap
    summary = m.get("step_time_s")
    if isinstance(summary, dict):
        summary.update(
            mean=statistics.fmean(kept),
            median=statistics.median(kept),
            stdev=statistics.stdev(kept) if cap > 1 else 0.0,
        )
    return out, sum(steps[cap:])


def comparisons(found: list[dict], looks: int) -> pd.DataFrame:
    with tempfile.TemporaryDirectory() as folder:
        d = Path(folder)
        outputs = Outputs(d / "summary.csv", d / "report.html", d / "plots")
        build_report(found, outputs, Options(looks=looks))
        return pd.read_csv(d / "comparisons.csv")


def headline(c: pd.DataFrame) -> str:
    """The headline's comparison (its pick against the baseline)."""
    rows = c[(c["kind"] == "baseline") & (c["headline"] == True)]  # noqa: E712
    return "; ".join(
        f"{r.experiment} {r.ratio:.2f}x [{r.ci_low:.2f}-{r.ci_high:.2f}] {r.verdict}"
        for r in rows.itertuples()
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("records", type=Path)
    parser.add_argument("--cap", type=int, nargs="+", default=[6, 5, 4, 3])
    parser.add_argument("--study-cap", type=int, help="the study's `steps` (default: its "
                        "records' most common, epochs runs left out)")  # fmt: skip
    parser.add_argument("--looks", type=int, default=3, help="the study's max_trials - trials + 1")
    args = parser.parse_args(argv)
    found = records(args.records)
    study_cap = args.study_cap or statistics.mode(
        (r.get("spec") or {}).get("steps") for r in found if not (r.get("spec") or {}).get("epochs")
    )
    ran = comparisons(found, args.looks)
    print(f"{len(found)} trials, {study_cap} timed steps at most; as they ran: "
          f"{ran['verdict'].isin(DECIDED).sum()} of "
          f"{len(ran)} comparisons decided, median interval width (log) "
          f"{(ran['ci_high'] / ran['ci_low']).map(math.log).median():.4f}; "
          f"headline {headline(ran)}")  # fmt: skip
    for cap in args.cap:
        pairs = [cut(r, cap, study_cap) for r in found]
        c = comparisons([r for r, _ in pairs], args.looks)
        both = ran.merge(c, on=KEY, suffixes=("_ran", "_cut"))
        changed = both[both["verdict_ran"] != both["verdict_cut"]]
        shift = (both["ratio_cut"] / both["ratio_ran"]).map(math.log).abs()
        width = (c["ci_high"] / c["ci_low"]).map(math.log).median()
        print(f"cap {cap}: {sum(s for _, s in pairs) / 60:.1f} min of timed steps less; "
              f"{c['verdict'].isin(DECIDED).sum()} of {len(c)} decided; median width "
              f"{width:.4f}; ratios moved by {shift.median():.4f} (median), "
              f"{shift.quantile(0.9):.4f} (90th percentile); {len(changed)} verdicts changed; "
              f"headline {headline(c)}")  # fmt: skip
        for r in changed.itertuples():
            print(f"    {r.baseline} / {r.experiment}: {r.ratio_ran:.3f} "
                  f"[{r.ci_low_ran:.3f}-{r.ci_high_ran:.3f}] {r.verdict_ran} -> {r.ratio_cut:.3f} "
                  f"[{r.ci_low_cut:.3f}-{r.ci_high_cut:.3f}] {r.verdict_cut}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
