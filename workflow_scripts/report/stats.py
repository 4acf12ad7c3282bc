"""The numbers behind the report: per-experiment statistics, baselines, speedups, and
the ladder, backend, ceiling and cost frames (pandas only: no plots, no HTML)."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from workflow_scripts import backends
from workflow_scripts.plan.clock import LEFT_OUT
from workflow_scripts.spec import fields
from workflow_scripts.summary import results
from workflow_scripts.summary.records import INCORRECT, OK, SPEC_COLUMNS

from .compare import same_workload
from .uncertainty import MARGIN, between, geo_mean, with_spread
from .values import isnan

# The sweep groups, their x column and labels (the plots and the HTML sections share them).
SWEEPS = {
    # group: (x column, x label, section title)
    "batch_size": ("batch_size", "batch size (samples per step)", "Batch size"),
    "num_workers": ("num_workers", "DataLoader workers (num_workers)", "DataLoader workers"),
    "threads": ("threads", "intra-op threads", "Threads"),
}
BACKEND_ORDER = tuple(backends.names())
# How each figure is taken over an experiment's trials: declared with the figure
# (workflow_scripts/summary/results.py, ``stat``). Absent columns (older summaries) read as empty.
#: texts: the distinct ones of every trial (a measurement error, the noise signals)
OPTIONAL_TEXT = tuple(results.with_stat("distinct"))
#: ... of its ok trials (the ISA an inference run's INT8 kernels ran on)
OK_TEXT = tuple(results.with_stat("distinct_ok"))
#: what an inference run's served model computed: medians over its ok trials (noise
#: does not change them)
SERVING_COLS = results.with_stat("median_ok")
#: one-off costs (the first step: its compile): the median over the trials that
#: compiled cold (a later trial starts from its first trial's cache)
COLD_COLS = results.with_stat("median_cold")
# Percentiles and the fewest timed steps that make them mean something: a pXX needs
# at least 100 / (100 - XX) samples beyond it (p90: 10, p95: 20, p99: 100).
PERCENTILE_MIN_STEPS = {"p90": 10, "p95": 20, "p99": 100}


def _first(series: pd.Series) -> Any:
    present = series.dropna()
    return present.iloc[0] if len(present) else None


def spread_stats(values: pd.Series) -> dict[str, float]:
    """Median, min, max and coefficient of variation (sample stdev / mean) of a series;
    the CV needs two values or more."""
    v = pd.to_numeric(values, errors="coerce").astype("float64").dropna()
    if not len(v):
        return {"median": math.nan, "min": math.nan, "max": math.nan, "cv": math.nan}
    mean = v.mean()
    cv = float(v.std(ddof=1) / mean) if len(v) > 1 and mean > 0 else math.nan
    return {"median": float(v.median()), "min": float(v.min()), "max": float(v.max()), "cv": cv}


#: per-step timing and memory, FLOPs, the probes and the ceiling: the median over the
#: used trials; the gradient check's: of a run without usable trials too
GRADIENT_COLS = results.with_stat("median_any")
MEDIAN_COLS = results.with_stat("median", "median_any")


def setting_columns() -> list[str]:
    """What an experiment is: the first columns, each the value of the used trials (of
    any trial where they have none): the results declared ``stat="first"`` (its
    backend, threads, precision, node type, versions, ...), every knob's column and
    what the loader derives (records.SPEC_COLUMNS), and the spec's ``time_budget_s``
    (read from the records by :func:`enrich`)."""
    cols = [*results.with_stat("first"), *SPEC_COLUMNS, "time_budget_s"]
    # every field the report compares by (the registry's), added or not
    registry = [*fields.compare_keys(*fields.COMPARE_ROLES), *fields.trajectory_keys()]
    return list(dict.fromkeys([*cols, *registry]))


def experiment_stats(
    frame: pd.DataFrame, margin: float = MARGIN, looks: int = 1, look: int | None = None
) -> pd.DataFrame:
    """One row per experiment, in order of first appearance (with the run's spread and
    the verdicts' ``margin``, the ``looks`` at each comparison and which ``look`` this
    is (default: the last) on every row: :func:`uncertainty.with_spread`).

    ``n_ok`` counts trials with status ok and a finite ``samples_per_s``, ``n_noisy``
    those of them marked noisy. The throughput (``sps_median``, ``sps_min``,
    ``sps_max``, ``sps_cv``) and the other medians use the ``n_used`` trials: the
    ok ones that are not noisy, or, when the noisy ones outnumber them, all of them
    (``noisy_used`` true; :func:`used_trials`).
    """
    first_cols = setting_columns()
    frame = _with_trial_columns(frame, first_cols)
    rows = [
        _experiment_row(experiment, sub, first_cols)
        for experiment, sub in frame.groupby("experiment", sort=False)
    ]
    columns = ["experiment", *first_cols, "n_trials", "n_ok", "n_noisy", "n_used", "noisy_used"]
    columns += ["statuses", "sps_median", "sps_min", "sps_max", "sps_cv", "sps_used", "sps_nodes"]
    columns += MEDIAN_COLS
    columns += COLD_COLS
    columns += ["train_time_s", "train_time_used", "test_accuracy", "test_accuracy_min"]
    columns += ["test_accuracy_max"]
    columns += [
        "time_to_accuracy_s",
        "n_reached",
        "n_accuracy",
        "steps_timed",
        "steps_timed_total",
        "n_budget_hit",
        *OPTIONAL_TEXT,
        *SERVING_COLS,
        *OK_TEXT,
    ]
    # the run's pooled spread on every row: any two rows make a comparison (uncertainty.py)
    return with_spread(pd.DataFrame(rows, columns=columns), margin, looks, look)


def _with_trial_columns(frame: pd.DataFrame, first_cols: list[str]) -> pd.DataFrame:
    """The trials (one row each, per node type) with every column the statistics read,
    and which of them count: ``_usable`` (ok, with a throughput), ``_noisy``, ``_sps``."""
    frame = per_node_type(frame)
    frame["experiment"] = frame["experiment"].fillna("(unknown)")
    sps = pd.to_numeric(frame["samples_per_s"], errors="coerce").astype("float64")
    frame["_usable"] = (frame["status"] == OK) & sps.notna()
    noisy = frame["noisy"] if "noisy" in frame else pd.Series(False, index=frame.index)
    frame["_noisy"] = noisy.fillna(False).astype(bool)
    frame["_sps"] = sps
    extra = ["steps_timed", "time_to_accuracy_s", *SERVING_COLS, *COLD_COLS]
    text = (*OPTIONAL_TEXT, *OK_TEXT)
    for col in [*first_cols, *MEDIAN_COLS, *text, *extra]:
        if col not in frame:
            frame[col] = None if col in text else math.nan
    if "time_budget_hit" not in frame:
        frame["time_budget_hit"] = None
    fresh = frame["compile_cache_fresh"] if "compile_cache_fresh" in frame else None
    frame["_warm"] = False if fresh is None else fresh.map(lambda v: str(v) == "False")
    return frame


def _experiment_row(experiment: str, sub: pd.DataFrame, first_cols: list[str]) -> dict:
    """The statistics of one experiment's trials."""
    ok = sub[sub["_usable"]]
    clean = ok[~ok["_noisy"]]
    used = used_trials(ok, clean)
    pick = used if len(used) else sub
    row: dict[str, Any] = {"experiment": experiment}
    for col in first_cols:
        value = _first(pick[col])
        row[col] = _first(sub[col]) if value is None else value
    row["n_trials"] = len(sub)
    row["n_ok"] = len(ok)
    row["n_noisy"] = int(ok["_noisy"].sum())
    row["n_used"] = len(used)
    row["noisy_used"] = bool(len(used) > len(clean))
    counts = sub["status"].fillna("crashed").value_counts(sort=False)
    row["statuses"] = ", ".join(f"{k}×{v}" if v > 1 else str(k) for k, v in counts.items())
    spread = spread_stats(used["_sps"])
    for key in ("median", "min", "max", "cv"):
        row[f"sps_{key}"] = spread[key]
    # each used trial's throughput: what a comparison's interval rests on (uncertainty.py)
    row["sps_used"] = tuple(float(v) for v in used["_sps"].dropna())
    # and the node each ran on (the interval carries the node-to-node spread where the
    # two sides' nodes differ: uncertainty.node_term)
    hosts = used.loc[used["_sps"].notna(), "hostname"] if "hostname" in used else ()
    row["sps_nodes"] = tuple("" if h is None or h != h else str(h) for h in hosts)
    for col in MEDIAN_COLS:
        # the gradient check's figures also of a run with no usable trial (incorrect)
        of = pick if col in GRADIENT_COLS else used
        values = pd.to_numeric(of[col], errors="coerce").astype("float64")
        row[col] = values.median() if len(of) else math.nan
    # held-out accuracy does not depend on the machine's noise: every ok trial counts
    accuracy = pd.to_numeric(ok["test_accuracy"], errors="coerce").dropna()
    row["test_accuracy"] = accuracy.median() if len(accuracy) else math.nan
    row["test_accuracy_min"] = accuracy.min() if len(accuracy) else math.nan
    row["test_accuracy_max"] = accuracy.max() if len(accuracy) else math.nan
    row["n_accuracy"] = len(accuracy)
    # the training time until the target accuracy: over the trials that reached it
    reached = pd.to_numeric(ok["time_to_accuracy_s"], errors="coerce").dropna()
    row["time_to_accuracy_s"] = reached.median() if len(reached) else math.nan
    row["n_reached"] = len(reached)
    train = pd.to_numeric(used["train_time_s"], errors="coerce")
    row["train_time_s"] = train.median() if len(used) else math.nan
    row["train_time_used"] = tuple(float(v) for v in train.dropna())
    timed = pd.to_numeric(used["steps_timed"], errors="coerce").dropna()
    row["steps_timed"] = timed.min() if len(timed) else math.nan
    row["steps_timed_total"] = timed.sum() if len(timed) else math.nan
    row["n_budget_hit"] = int(used["time_budget_hit"].map(_true).sum())
    for col in OPTIONAL_TEXT:
        row[col] = "; ".join(_distinct(sub[col]))
    for col in SERVING_COLS:
        values = pd.to_numeric(ok[col], errors="coerce").dropna()
        row[col] = values.median() if len(values) else math.nan
    cold = used[~used["_warm"]]
    if not len(cold):  # (its cold trial noisy or failed: the ok ones that compiled cold)
        cold = ok[~ok["_warm"]]
    for col in COLD_COLS:
        values = pd.to_numeric(cold[col], errors="coerce").dropna()
        row[col] = values.median() if len(values) else math.nan
    for col in OK_TEXT:
        row[col] = "; ".join(_distinct(ok[col]))
    return row


def used_trials(ok: pd.DataFrame, clean: pd.DataFrame) -> pd.DataFrame:
    """The trials an experiment's figures rest on: its ``clean`` ok trials, leaving the
    noisy ones out as outliers, unless the noisy ones outnumber them. Then the noise is
    the machine's, not a trial's: the probes flag whole stretches of a busy shared
    machine, and keeping the few trials that fell in its quiet moments would pick an
    experiment's figure by when its trials ran (two identical experiments came out
    1.45x apart that way on a CI host, 3 of 8 and 5 of 8 trials used). So all of its ok
    trials are used, and the tables flag them."""
    return clean if len(clean) and len(clean) >= len(ok) - len(clean) else ok


def _true(value: Any) -> bool:
    return value is True or str(value).strip().lower() in ("true", "1", "yes")


def _distinct(series: pd.Series) -> list[str]:
    out: list[str] = []
    for value in series:
        if isnan(value) or not str(value).strip():
            continue
        for part in str(value).split("; "):
            if part and part not in out:
                out.append(part)
    return out


def per_node_type(frame: pd.DataFrame) -> pd.DataFrame:
    """With trials on several node types (a cluster of several CPU models), each
    experiment's trials on each type are rows of their own, ``<id> @ <node type>``: no
    median mixes CPU models, and group speedups compare runs on one type."""
    frame = frame.copy()
    if "node_type" not in frame:
        frame["node_type"] = None
    if frame["node_type"].dropna().nunique() > 1:
        frame["experiment"] = frame["experiment"] + " @ " + frame["node_type"].fillna("unknown")
    return frame


def pick_baseline(stats: pd.DataFrame) -> str | None:
    """``baseline`` if the ladder has it, else the ladder's first experiment."""
    ladder = stats[stats["group"] == "ladder"]
    if (ladder["experiment"] == "baseline").any():
        return "baseline"
    if len(ladder):
        return str(ladder["experiment"].iloc[0])
    if (stats["experiment"] == "baseline").any():
        return "baseline"
    return None


def baseline_sps(stats: pd.DataFrame, baseline: str | None) -> float:
    if baseline is None:
        return math.nan
    match = stats.loc[stats["experiment"] == baseline, "sps_median"]
    return float(match.iloc[0]) if len(match) else math.nan


def with_speedup(stats: pd.DataFrame, base: float) -> pd.DataFrame:
    """Add ``speedup`` (median) and its spread ``speedup_min``/``speedup_max``."""
    out = stats.copy()
    ok = base > 0 if not math.isnan(base) else False
    for src, dst in (
        ("sps_median", "speedup"),
        ("sps_min", "speedup_min"),
        ("sps_max", "speedup_max"),
    ):
        out[dst] = out[src] / base if ok else math.nan
    return out


def with_group_speedup(stats: pd.DataFrame) -> pd.DataFrame:
    """Add ``group_baseline`` (the group's first experiment) and ``group_speedup``."""
    out = stats.copy()
    groups = out["group"].fillna("(none)")
    if "node_type" in out and out["node_type"].dropna().nunique() > 1:
        groups = groups + " @ " + out["node_type"].fillna("unknown")
    first = out.groupby(groups, sort=False)["experiment"].transform("first")
    # transform("first") skips NaN; the group's baseline is its first row, ok or not
    heads = out.groupby(groups, sort=False).head(1).set_index("experiment")["sps_median"]
    first_sps = first.map(heads).astype("float64")
    out["group_baseline"] = first
    out["group_speedup"] = out["sps_median"] / first_sps.where(first_sps > 0)
    return out


def ladder_frame(stats: pd.DataFrame, baseline: str | None) -> pd.DataFrame:
    """The ladder's rows with their ``speedup`` over the baseline and ``compared``: that
    comparison with its interval and verdict (None without a baseline)."""
    ladder = with_speedup(stats[stats["group"] == "ladder"], baseline_sps(stats, baseline))
    base = stats[stats["experiment"] == baseline]
    ref = base.iloc[0] if baseline is not None and len(base) else None
    ladder["compared"] = [
        None if ref is None or r["experiment"] == baseline else between(ref, r, "baseline")
        for _, r in ladder.iterrows()
    ]
    return ladder.reset_index(drop=True)


def backend_frame(stats: pd.DataFrame, baseline: str | None) -> pd.DataFrame:
    """The best ok experiment per backend (highest median samples/s).

    Backends that appear in the records but have no ok trial get a row with
    NaN throughput. Order: eager, inductor, ipex, xla, then any others.
    """
    stats = with_speedup(stats, baseline_sps(stats, baseline))
    present = [b for b in stats["backend"].dropna().unique()]
    order = [b for b in BACKEND_ORDER if b in present]
    order += sorted(b for b in present if b not in BACKEND_ORDER)
    rows = []
    for backend in order:
        sub = stats[(stats["backend"] == backend) & stats["sps_median"].notna()]
        if len(sub):
            rows.append(sub.loc[sub["sps_median"].idxmax()])
        else:
            empty = stats[stats["backend"] == backend].iloc[0].copy()
            empty["experiment"] = None
            rows.append(empty)
    if not rows:
        return stats.iloc[0:0].reset_index(drop=True)
    return pd.DataFrame(rows).reset_index(drop=True)


def best_experiment(stats: pd.DataFrame) -> pd.Series | None:
    usable = stats[stats["sps_median"].notna()]
    if not len(usable):
        return None
    return usable.loc[usable["sps_median"].idxmax()]


# The article's own figures (Chaim Rand, "Training AI Models on CPU", 2024; the README's
# Sources), for pricing its instance with its
# throughput, never with ours: ResNet-50, batch 128, 8-vCPU Sapphire Rapids, PyTorch 2.4.
ARTICLE_CLAIMS = {
    "baseline": ("fp32 eager (the article's claim)", 9.12),
    "best": ("bf16 + channels_last + run_cpu + ipex.optimize (the article's claim)", 40.73),
}
THROUGHPUT_SOURCES = ("measured", "article")


def parse_prices(prices: Any) -> list[dict]:
    """Normalise ``--prices-json`` (a list of {name, usd_per_hour, note, throughput} or
    one such dict). ``throughput``: ``measured`` (the default: the price of the machine
    these results were measured on) or ``article`` (price the article's instance with
    the article's own figures)."""
    if prices is None:
        return []
    if isinstance(prices, str):
        prices = json.loads(prices) if prices.strip() else []
    if isinstance(prices, Mapping):
        prices = [prices]
    out = []
    for i, item in enumerate(prices or []):
        if not isinstance(item, Mapping):
            continue
        usd = item.get("usd_per_hour")
        try:
            usd = float(usd)
        except (TypeError, ValueError):
            usd = math.nan
        source = str(item.get("throughput") or "measured")
        out.append(
            {
                "name": str(item.get("name") or f"price {i + 1}"),
                "usd_per_hour": usd,
                "note": "" if item.get("note") is None else str(item.get("note")),
                "throughput": source if source in THROUGHPUT_SOURCES else "measured",
            }
        )
    return out


def samples_per_dollar(sps: float, usd_per_hour: float) -> float:
    if isnan(sps) or isnan(usd_per_hour) or usd_per_hour <= 0:
        return math.nan
    return sps * 3600.0 / usd_per_hour


def usd_per_million(sps: float, usd_per_hour: float) -> float:
    """Dollars per million training samples at ``sps`` samples/s and an hourly price."""
    if isnan(sps) or isnan(usd_per_hour) or sps <= 0 or usd_per_hour < 0:
        return math.nan
    return usd_per_hour / (sps * 3600.0) * 1e6


def best_like_baseline(
    stats: pd.DataFrame, baseline: str | None, exclude: Sequence[str] = ()
) -> pd.Series | None:
    """The fastest experiment that trains the baseline's workload (model, mode, image
    size or sequence length, no epochs); without a baseline, the first training run's
    (an inference run's samples/s is no training throughput). ``exclude``: experiments
    not to recommend (their losses diverge)."""
    usable = like_baseline(stats, baseline, exclude)
    return usable.iloc[0] if len(usable) else None


def like_baseline(
    stats: pd.DataFrame, baseline: str | None, exclude: Sequence[str] = ()
) -> pd.DataFrame:
    """The candidates of :func:`best_like_baseline`, fastest first (the baseline among
    them): by the geometric mean of their used trials' throughput, the statistic each
    comparison's ratio and interval rest on (``uncertainty.between``), so that the
    fastest is the one with the largest stated speedup (the median where a row has no
    trials listed)."""
    usable = stats[stats["sps_median"].notna() & ~stats["experiment"].isin(list(exclude))]
    ref = None
    if baseline is not None and (stats["experiment"] == baseline).any():
        ref = stats[stats["experiment"] == baseline].iloc[0]
    elif "mode" in stats:
        train = stats[stats["mode"].astype(str) != "inference"]
        ref = train.iloc[0] if len(train) else None
    if ref is not None:
        ref = ref.to_dict()
        keep = [same_workload(ref, r) for r in usable.to_dict("records")]
        usable = usable.loc[pd.Series(keep, index=usable.index, dtype=bool)]
    key = usable.apply(geo_mean, axis=1) if len(usable) else usable["sps_median"]
    return usable.loc[key.sort_values(ascending=False, kind="stable").index]


def cost_frame(
    stats: pd.DataFrame,
    baseline: str | None,
    prices: Sequence[Mapping],
    exclude: Sequence[str] = (),
) -> pd.DataFrame:
    """Per price, the cost of the baseline and of the fastest experiment of the same
    workload: samples per dollar and dollars per million samples. A ``measured`` price
    is this machine's, applied to the throughput measured here; an ``article`` price
    is the article's instance, applied to the article's own figures (its claims)."""
    base = baseline_sps(stats, baseline)
    best = best_like_baseline(stats, baseline, exclude)
    best_sps = math.nan if best is None else float(best["sps_median"])
    rows = []
    for price in prices:
        usd = price["usd_per_hour"]
        if price.get("throughput") == "article":
            (b_name, b_sps), (t_name, t_sps) = ARTICLE_CLAIMS["baseline"], ARTICLE_CLAIMS["best"]
        else:
            b_name, b_sps = baseline, base
            t_name, t_sps = (None if best is None else best["experiment"]), best_sps
        rows.append(
            {
                "name": price["name"],
                "usd_per_hour": usd,
                "note": price["note"],
                "throughput": price.get("throughput", "measured"),
                "baseline": b_name,
                "baseline_sps": b_sps,
                "baseline_samples_per_usd": samples_per_dollar(b_sps, usd),
                "baseline_usd_per_million": usd_per_million(b_sps, usd),
                "best": t_name,
                "best_sps": t_sps,
                "best_samples_per_usd": samples_per_dollar(t_sps, usd),
                "best_usd_per_million": usd_per_million(t_sps, usd),
            }
        )
    columns = ["name", "usd_per_hour", "note", "throughput", "baseline", "baseline_sps"]
    columns += ["baseline_samples_per_usd", "baseline_usd_per_million", "best", "best_sps"]
    columns += ["best_samples_per_usd", "best_usd_per_million"]
    return pd.DataFrame(rows, columns=columns)


def ceiling_frame(stats: pd.DataFrame) -> pd.DataFrame:
    """Experiments with a FLOP count: achieved GFLOP/s against the measured matmul
    ceiling of the dtype they trained in. The calibrated ceiling (``ceiling_gflops``,
    ``ceiling_dtype``) where the summary has it; else, for older records, the trial's
    own noise probe (for bf16 autocast the faster of bf16 and fp32), so labelled. A
    measurement error (e.g. more than 100% of the ceiling) leaves the share empty
    and is carried in ``measurement_error``."""
    rows = []
    for _, r in stats.iterrows():
        if isnan(r["flops_per_sample"]):
            continue
        error = r.get("measurement_error")
        error = "" if isnan(error) else str(error)
        if not isnan(r.get("ceiling_gflops")):
            dtype = str(r.get("ceiling_dtype") or r["precision"] or "fp32")
            peak, source = r["ceiling_gflops"], "calibrated ceiling"
        else:  # an older summary: % of the trial's own noise probe, if anything
            dtype = "fp32"  # bf16 autocast: the faster of the two probes (probe.peak_rate)
            if r["precision"] == "bf16" and not r["probe_bf16_gflops"] < r["probe_fp32_gflops"]:
                dtype = "bf16"
            peak, source = r[f"probe_{dtype}_gflops"], "noise probe (older records)"
            if isnan(r["pct_of_peak"]):
                peak, source = math.nan, "n/a"
                error = error or "no calibrated ceiling recorded"
        rows.append(
            {
                "experiment": r["experiment"],
                "dtype": dtype,
                "flops_per_sample": r["flops_per_sample"],
                "samples_per_s": r["sps_median"],
                "achieved_gflops": r["achieved_gflops"],
                "peak_gflops": peak,
                "pct_of_peak": math.nan if error else r["pct_of_peak"],
                "ceiling_source": source,
                "measurement_error": error,
            }
        )
    columns = ["experiment", "dtype", "flops_per_sample", "samples_per_s", "achieved_gflops"]
    columns += ["peak_gflops", "pct_of_peak", "ceiling_source", "measurement_error"]
    return pd.DataFrame(rows, columns=columns)


def trial_counts(frame: pd.DataFrame) -> tuple[int, int, int]:
    """The number of trials, of ok ones, and of the failed ones (failed, crashed, timed
    out, ...: not those the budget's clock left out, :func:`left_out`, nor the ones that
    ran whole but failed the gradient check, :func:`incorrect`)."""
    n = len(frame)
    n_ok = int((frame["status"] == OK).sum())
    return n, n_ok, n - n_ok - left_out(frame) - incorrect(frame)


def incorrect(frame: pd.DataFrame) -> int:
    """The trials that ran whole but whose gradients failed the check (no failure to run,
    no measurement either: their figures are the record's unchecked_metrics)."""
    return int((frame["status"] == INCORRECT).sum())


def left_out(frame: pd.DataFrame) -> int:
    """The trials the budget's clock left out (plan/clock.py): they run next time."""
    return int((frame["status"] == LEFT_OUT).sum())


def checked_effect(spec: Mapping, checks: Mapping) -> str:
    """What the harness saw take effect in a trial's last step (its ``checks``), in words,
    with a warning where it differs from what the spec asked for."""
    words = []
    dtype = checks.get("output_dtype")
    if dtype:
        short = {"bfloat16": "bf16", "float32": "fp32"}.get(dtype, dtype)
        asked = spec.get("precision")
        words.append(f"{short} output" + (f" (asked {asked}!)" if asked and asked != short else ""))
    inputs, weights = checks.get("input_channels_last"), checks.get("weights_channels_last")
    cl = [what for what, on in (("inputs", inputs), ("weights", weights)) if on]
    if spec.get("channels_last") and len(cl) < 2:
        missing = [w for w in ("inputs", "weights") if w not in cl]
        words.append(f"channels_last asked, {' and '.join(missing)} not channels_last!")
    elif cl:
        words.append(f"channels_last {'+'.join(cl)}")
    compiled = checks.get("compiled")
    if compiled:
        words.append("compiled")
    elif compiled is False and spec.get("compile") not in (None, "none"):
        words.append("not compiled!")
    device = checks.get("device")
    if device and device != "cpu":
        words.append(f"device {device}")
    return ", ".join(words)


def in_effect(records: Sequence[Mapping]) -> dict[str, str]:
    """Per experiment, what its ok trials' checks saw take effect (distinct findings of
    several trials joined with " / ")."""
    seen: dict[str, list[str]] = {}
    for rec in records:
        if not isinstance(rec, Mapping):
            continue
        checks = rec.get("checks")
        if rec.get("status") != OK or not isinstance(checks, Mapping):
            continue
        spec = rec.get("spec") if isinstance(rec.get("spec"), Mapping) else {}
        text = checked_effect(spec, checks)
        found = seen.setdefault(str(rec.get("experiment")), [])
        if text and text not in found:
            found.append(text)
    return {exp: " / ".join(texts) for exp, texts in seen.items()}


# ------------------------------------------------------------------ from the records


def _spec_and_metrics(record: Any) -> tuple[Mapping, Mapping]:
    if not isinstance(record, Mapping):
        return {}, {}
    spec = record.get("spec") if isinstance(record.get("spec"), Mapping) else {}
    metrics = record.get("metrics") if isinstance(record.get("metrics"), Mapping) else {}
    return spec, metrics


def _cv_of(times: Any) -> float:
    if not isinstance(times, list):
        return math.nan
    v = pd.to_numeric(pd.Series(times, dtype="object"), errors="coerce").dropna()
    if len(v) < 2 or v.mean() <= 0:
        return math.nan
    return float(v.std(ddof=1) / v.mean())


def enrich(frame: pd.DataFrame, records: Sequence[Any]) -> pd.DataFrame:
    """The summary rows plus what the report reads from the records themselves, each
    only where ``summary.csv`` has no such column (yet): the spec's ``seed``, ``lr``
    and ``time_budget_s``; the timed steps actually run (``steps_timed``), whether the
    time budget cut them short (``time_budget_hit``) and the within-trial step-time
    CV (``step_time_cv``). Rows and records correspond one to one, in order; without
    records (a summary.csv read back) the columns stay empty."""
    frame = frame.copy()
    n = len(frame)
    records = list(records)[:n] + [None] * max(0, n - len(records))
    pairs = [_spec_and_metrics(r) for r in records]
    derived = {
        "seed": lambda spec, m, r: _num(spec.get("seed")),
        "lr": lambda spec, m, r: _num(spec.get("lr")),
        "time_budget_s": lambda spec, m, r: _num(spec.get("time_budget_s")),
        "steps_timed": lambda spec, m, r: _num(m.get("steps_timed")),
        "time_budget_hit": lambda spec, m, r: (
            m.get("time_budget_hit") if isinstance(m.get("time_budget_hit"), bool) else None
        ),
        "step_time_cv": lambda spec, m, r: _cv_of(
            r.get("step_times_s") if isinstance(r, Mapping) else None
        ),
    }
    for col, get in derived.items():
        if col in frame:
            continue
        frame[col] = [get(spec, m, r) for (spec, m), r in zip(pairs, records)] if n else []
    return frame


def _num(value: Any) -> float:
    if isinstance(value, bool) or value is None:
        return math.nan
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def loss_curves(frame: pd.DataFrame, records: Sequence[Any]) -> dict[int, list[float]]:
    """Each ok row's per-step losses (warm-up steps included), by row position."""
    out: dict[int, list[float]] = {}
    for i, record in enumerate(list(records)[: len(frame)]):
        if not isinstance(record, Mapping) or frame["status"].iloc[i] != OK:
            continue
        losses = record.get("losses")
        if isinstance(losses, list) and losses:
            out[i] = [_num(v) for v in losses]
    return out


def percentile_ok(name: str, steps: Any) -> bool:
    """Whether ``steps`` timed steps are enough for percentile ``name`` (p90, p95, p99);
    unknown step counts are given the benefit of the doubt."""
    need = PERCENTILE_MIN_STEPS.get(name, 0)
    return isnan(steps) or float(steps) >= need
