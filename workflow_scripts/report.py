"""Build ``summary.csv``, the plots and a self-contained HTML report from trial records.

Usage::

    python -m workflow_scripts.report --records R1.json R2.json ... \\
        --summary results/summary.csv --html results/report/index.html \\
        --plots-dir results/report [--prices-json '[{"name": ..., "usd_per_hour": ...}]'] \\
        [--noise-threshold 0.85] [--title T]

Per experiment, throughput is the median of ``samples_per_s`` over its ok trials
that were not marked noisy (see ``records.mark_noisy``; when every ok trial was
noisy, over all of them, flagged), with the spread min-max and the coefficient of
variation when there are several. Speedups are relative to
the ladder's baseline: the experiment ``baseline`` if present, else the first
experiment of group ``ladder`` in record order. The plot files in ``--plots-dir``
have fixed names (:data:`PLOT_NAMES`) and are always written: a group without
data gets a figure that says "no successful trials in this group".
"""

from __future__ import annotations

import argparse
import html
import io
import json
import math
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib
import matplotlib.patches
import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.ticker import FixedLocator, NullLocator, ScalarFormatter

from workflow_scripts.cli import announce
from workflow_scripts.records import (
    DEFAULT_NOISE_THRESHOLD,
    OK,
    error_parts,
    load_records,
    noise_group_keys,
    summary_frame,
)

matplotlib.use("Agg")  # no display; pyplot picks the backend lazily, so this is in time

PLOT_NAMES = ("ladder", "batch_size", "num_workers", "threads", "backends", "roofline")
SWEEPS = {
    # group: (x column, x label, section title)
    "batch_size": ("batch_size", "batch size (samples per step)", "Batch size"),
    "num_workers": ("num_workers", "DataLoader workers (num_workers)", "DataLoader workers"),
    "threads": ("threads", "intra-op threads", "Threads"),
}
COVERED_GROUPS = {"ladder", *SWEEPS}
BACKEND_ORDER = ("eager", "inductor", "ipex", "xla")
NO_DATA = "no successful trials in this group"
DEFAULT_TITLE = "Training AI models on CPU: benchmark report"
CAPTIONS_DIR = Path(__file__).with_name("captions")
# Settings that may differ between the experiments of one sweep; those that do
# split the sweep into several lines.
SERIES_KEYS = (
    "backend",
    "model",
    "precision",
    "channels_last",
    "compile",
    "launcher",
    "allocator",
    "batch_size",
    "num_workers",
    "threads",
)

STYLE = {
    "font.size": 10,
    "axes.titlesize": 11,
    "axes.titleweight": "bold",
    "axes.labelsize": 10,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "grid.linestyle": "-",
    "legend.frameon": False,
    "svg.fonttype": "none",
    "svg.hashsalt": "cpu-training-report",
    "figure.dpi": 100,
}
SVG_METADATA = {"Creator": None, "Date": None, "Format": None, "Type": None}

# --------------------------------------------------------------------------- numbers


def _first(series: pd.Series) -> Any:
    present = series.dropna()
    return present.iloc[0] if len(present) else None


def _isnan(x: Any) -> bool:
    try:
        return x is None or pd.isna(x)
    except (TypeError, ValueError):
        return False


def spread_stats(values: pd.Series) -> dict[str, float]:
    """Median, min, max and coefficient of variation (sample stdev / mean) of a series;
    the CV needs two values or more."""
    v = pd.to_numeric(values, errors="coerce").astype("float64").dropna()
    if not len(v):
        return {"median": math.nan, "min": math.nan, "max": math.nan, "cv": math.nan}
    mean = v.mean()
    cv = float(v.std(ddof=1) / mean) if len(v) > 1 and mean > 0 else math.nan
    return {"median": float(v.median()), "min": float(v.min()), "max": float(v.max()), "cv": cv}


def experiment_stats(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per experiment, in order of first appearance.

    ``n_ok`` counts trials with status ok and a finite ``samples_per_s``, ``n_noisy``
    those of them marked noisy. The throughput (``sps_median``, ``sps_min``,
    ``sps_max``, ``sps_cv``) and the other medians use the ``n_used`` trials: the
    ok ones that are not noisy, or, when all ok trials are noisy, all of them
    (``noisy_only`` true).
    """
    frame = frame.copy()
    frame["experiment"] = frame["experiment"].fillna("(unknown)")
    sps = pd.to_numeric(frame["samples_per_s"], errors="coerce").astype("float64")
    frame["_usable"] = (frame["status"] == OK) & sps.notna()
    noisy = frame["noisy"] if "noisy" in frame else pd.Series(False, index=frame.index)
    frame["_noisy"] = noisy.fillna(False).astype(bool)
    frame["_sps"] = sps
    first_cols = [
        "group",
        "backend",
        "env",
        "model",
        "data",
        "precision",
        "channels_last",
        "compile",
        "compile_mode",
        "ipex_optimize",
        "launcher",
        "allocator",
        "openmp",
        "batch_size",
        "num_workers",
        "threads",
        "claim_speedup",
        "torch_version",
        "ipex_version",
        "torch_xla_version",
    ]
    timing_cols = [
        "step_time_median_s",
        "step_time_p90_s",
        "step_time_p99_s",
        "time_to_first_step_s",
        "peak_rss_mb",
    ]
    roofline_cols = [
        "flops_per_sample",
        "achieved_gflops",
        "pct_of_peak",
        "probe_fp32_gflops",
        "probe_bf16_gflops",
    ]
    rows = []
    for experiment, sub in frame.groupby("experiment", sort=False):
        ok = sub[sub["_usable"]]
        clean = ok[~ok["_noisy"]]
        used = clean if len(clean) else ok
        pick = used if len(used) else sub
        row: dict[str, Any] = {"experiment": experiment}
        for col in first_cols:
            value = _first(pick[col])
            row[col] = _first(sub[col]) if value is None else value
        row["n_trials"] = len(sub)
        row["n_ok"] = len(ok)
        row["n_noisy"] = int(ok["_noisy"].sum())
        row["n_used"] = len(used)
        row["noisy_only"] = bool(len(ok) and not len(clean))
        counts = sub["status"].fillna("crashed").value_counts(sort=False)
        row["statuses"] = ", ".join(f"{k}×{v}" if v > 1 else str(k) for k, v in counts.items())
        spread = spread_stats(used["_sps"])
        for key in ("median", "min", "max", "cv"):
            row[f"sps_{key}"] = spread[key]
        for col in timing_cols + roofline_cols:
            values = pd.to_numeric(used[col], errors="coerce").astype("float64")
            row[col] = values.median() if len(used) else math.nan
        rows.append(row)
    columns = ["experiment", *first_cols, "n_trials", "n_ok", "n_noisy", "n_used", "noisy_only"]
    columns += ["statuses", "sps_median", "sps_min", "sps_max", "sps_cv"]
    columns += [*timing_cols, *roofline_cols]
    return pd.DataFrame(rows, columns=columns)


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
    first = out.groupby(groups, sort=False)["experiment"].transform("first")
    # transform("first") skips NaN; the group's baseline is its first row, ok or not
    heads = out.groupby(groups, sort=False).head(1).set_index("experiment")["sps_median"]
    first_sps = first.map(heads).astype("float64")
    out["group_baseline"] = first
    out["group_speedup"] = out["sps_median"] / first_sps.where(first_sps > 0)
    return out


def ladder_frame(stats: pd.DataFrame, baseline: str | None) -> pd.DataFrame:
    ladder = stats[stats["group"] == "ladder"]
    return with_speedup(ladder, baseline_sps(stats, baseline)).reset_index(drop=True)


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


def parse_prices(prices: Any) -> list[dict]:
    """Normalise ``--prices-json`` (a list of {name, usd_per_hour, note} or one such dict)."""
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
        out.append(
            {
                "name": str(item.get("name") or f"price {i + 1}"),
                "usd_per_hour": usd,
                "note": "" if item.get("note") is None else str(item.get("note")),
            }
        )
    return out


def samples_per_dollar(sps: float, usd_per_hour: float) -> float:
    if _isnan(sps) or _isnan(usd_per_hour) or usd_per_hour <= 0:
        return math.nan
    return sps * 3600.0 / usd_per_hour


def cost_frame(
    stats: pd.DataFrame, baseline: str | None, prices: Sequence[Mapping]
) -> pd.DataFrame:
    """Samples per dollar for the baseline and the best experiment at each price."""
    base = baseline_sps(stats, baseline)
    best = best_experiment(stats)
    best_sps = math.nan if best is None else float(best["sps_median"])
    rows = []
    for price in prices:
        usd = price["usd_per_hour"]
        rows.append(
            {
                "name": price["name"],
                "usd_per_hour": usd,
                "note": price["note"],
                "baseline": baseline,
                "baseline_samples_per_usd": samples_per_dollar(base, usd),
                "best": None if best is None else best["experiment"],
                "best_samples_per_usd": samples_per_dollar(best_sps, usd),
            }
        )
    columns = [
        "name",
        "usd_per_hour",
        "note",
        "baseline",
        "baseline_samples_per_usd",
        "best",
        "best_samples_per_usd",
    ]
    return pd.DataFrame(rows, columns=columns)


# --------------------------------------------------------------------------- formatting


def fmt_num(x: Any, digits: int | None = None) -> str:
    if _isnan(x):
        return ""
    x = float(x)
    if digits is None:
        digits = 0 if abs(x) >= 100 else 1 if abs(x) >= 10 else 2
    return f"{x:,.{digits}f}"


def fmt_spread(median: Any, lo: Any, hi: Any, n: int, digits: int | None = None) -> str:
    if _isnan(median):
        return ""
    text = fmt_num(median, digits)
    if n > 1 and not _isnan(lo) and not _isnan(hi):
        text += f" ({fmt_num(lo, digits)}–{fmt_num(hi, digits)})"
    return text


def fmt_speedup(s: Any, lo: Any = None, hi: Any = None, n: int = 1) -> str:
    if _isnan(s):
        return ""
    text = f"{float(s):.2f}×"
    if n > 1 and not _isnan(lo) and not _isnan(hi):
        text += f" ({float(lo):.2f}–{float(hi):.2f})"
    return text


def fmt_int(x: Any) -> str:
    if _isnan(x):
        return ""
    try:
        return str(int(x))
    except (TypeError, ValueError):
        return str(x)


def fmt_text(x: Any) -> str:
    if _isnan(x):
        return ""
    if isinstance(x, bool):
        return "yes" if x else "no"
    return str(x)


def fmt_cv(cv: Any) -> str:
    """A coefficient of variation as a percentage ("" with fewer than two trials)."""
    return "" if _isnan(cv) else f"{100 * float(cv):.1f}%"


def _trials(row: Mapping) -> str:
    text = f"{row['n_ok']}/{row['n_trials']}"
    n_noisy = row.get("n_noisy", 0)
    if not _isnan(n_noisy) and n_noisy:
        text += f" ({int(n_noisy)} noisy" + (", all used)" if row.get("noisy_only") else ")")
    return text


def _n_used(row: Mapping) -> int:
    n = row.get("n_used", row.get("n_ok", 0))
    return 0 if _isnan(n) else int(n)


def _group_note(sub: pd.DataFrame, baseline: str | None) -> str:
    if not len(sub):
        return ""
    first = html.escape(str(sub["group_baseline"].iloc[0]))
    base = html.escape(str(baseline)) if baseline else "none"
    return (
        f'<p class="note">"speedup vs baseline" is relative to the ladder baseline ({base}); '
        f'"vs first in group" to this group\'s first experiment ({first}).</p>'
    )


def _table(df: pd.DataFrame, css: str = "") -> str:
    if not len(df):
        return '<p class="empty">No rows.</p>'
    classes = ["data"] + ([css] if css else [])
    return df.to_html(index=False, escape=True, na_rep="", classes=classes, border=0)


def ladder_display(ladder: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for _, r in ladder.iterrows():
        launch = "/".join(x for x in (fmt_text(r["launcher"]), fmt_text(r["allocator"])) if x)
        rows.append(
            {
                "experiment": r["experiment"],
                "backend": fmt_text(r["backend"]),
                "precision": fmt_text(r["precision"]),
                "channels_last": fmt_text(r["channels_last"]),
                "compile": fmt_text(r["compile"]),
                "launcher/allocator": launch,
                "ok trials": _trials(r),
                "samples/s": fmt_spread(r["sps_median"], r["sps_min"], r["sps_max"], _n_used(r)),
                "CV": fmt_cv(r["sps_cv"]),
                "speedup": fmt_speedup(
                    r["speedup"], r["speedup_min"], r["speedup_max"], _n_used(r)
                ),
                "article's claim": fmt_speedup(r["claim_speedup"]),
                "step median (s)": fmt_num(r["step_time_median_s"], 3),
                "step p90 (s)": fmt_num(r["step_time_p90_s"], 3),
                "step p99 (s)": fmt_num(r["step_time_p99_s"], 3),
                "first step (s)": fmt_num(r["time_to_first_step_s"], 2),
                "peak RSS (MB)": fmt_num(r["peak_rss_mb"], 0),
            }
        )
    return pd.DataFrame(rows)


def generic_display(stats: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for _, r in stats.iterrows():
        rows.append(
            {
                "experiment": r["experiment"],
                "backend": fmt_text(r["backend"]),
                "model": fmt_text(r["model"]),
                "data": fmt_text(r["data"]),
                "precision": fmt_text(r["precision"]),
                "batch": fmt_int(r["batch_size"]),
                "workers": fmt_int(r["num_workers"]),
                "threads": fmt_int(r["threads"]),
                "ok trials": _trials(r),
                "samples/s": fmt_spread(r["sps_median"], r["sps_min"], r["sps_max"], _n_used(r)),
                "CV": fmt_cv(r["sps_cv"]),
                "speedup vs baseline": fmt_speedup(r.get("speedup")),
                "vs first in group": fmt_speedup(r.get("group_speedup")),
                "step median (s)": fmt_num(r["step_time_median_s"], 3),
                "first step (s)": fmt_num(r["time_to_first_step_s"], 2),
                "peak RSS (MB)": fmt_num(r["peak_rss_mb"], 0),
            }
        )
    return pd.DataFrame(rows)


# --------------------------------------------------------------------------- plots


def _save(fig: plt.Figure, path: Path) -> str:
    buf = io.StringIO()
    fig.savefig(buf, format="svg", metadata=SVG_METADATA, bbox_inches="tight")
    plt.close(fig)
    text = buf.getvalue()
    path.write_text(text, encoding="utf-8")
    return text


def _no_data(title: str, path: Path) -> str:
    with plt.rc_context(STYLE):
        fig, ax = plt.subplots(figsize=(6.4, 2.4))
        ax.set_axis_off()
        ax.set_title(title)
        ax.text(0.5, 0.5, NO_DATA, ha="center", va="center", fontsize=12, color="#666666")
        return _save(fig, path)


def _nanmax(*values: Any) -> float:
    finite = [float(v) for v in values if not _isnan(v)]
    return max(finite) if finite else math.nan


def plot_ladder(ladder: pd.DataFrame, path: Path, baseline: str | None = None) -> str:
    title = "Optimization ladder: measured speedup vs. the article's claim"
    if not ladder["speedup"].notna().any():
        return _no_data(title, path)
    n = len(ladder)
    with plt.rc_context(STYLE):
        fig, ax = plt.subplots(figsize=(7.5, max(2.6, 0.5 * n + 1.4)))
        y = list(range(n))
        speed = ladder["speedup"].astype("float64")
        lo = (speed - ladder["speedup_min"].astype("float64")).clip(lower=0).fillna(0)
        hi = (ladder["speedup_max"].astype("float64") - speed).clip(lower=0).fillna(0)
        colors = ["#9e9e9e" if e == baseline else "#1f77b4" for e in ladder["experiment"]]
        ax.barh(
            y,
            speed.fillna(0),
            height=0.55,
            color=colors,
            xerr=[lo, hi],
            error_kw={"ecolor": "#333333", "capsize": 3, "lw": 1},
            label="measured (median, min–max)",
            zorder=2,
        )
        claims = ladder["claim_speedup"].astype("float64")
        has_claim = claims.notna()
        if has_claim.any():
            ax.scatter(
                claims[has_claim],
                [yy for yy, c in zip(y, has_claim) if c],
                marker="D",
                s=36,
                color="#d62728",
                zorder=3,
                label="article's claim",
            )
        xmax = _nanmax(*(speed + hi), *claims, 1.0)
        for yy, s, h in zip(y, speed, hi):
            if _isnan(s):
                ax.text(0.02 * xmax, yy, "no ok trials", va="center", fontsize=9, color="#b00020")
            else:
                ax.text(s + h + 0.015 * xmax, yy - 0.3, f"{s:.2f}×", va="center", fontsize=8)
        ax.axvline(1.0, color="#555555", ls="--", lw=1, zorder=1)
        ax.set_yticks(y, [str(e) for e in ladder["experiment"]])
        ax.invert_yaxis()
        ax.set_xlim(0, xmax * 1.15)
        ax.set_xlabel("speedup over baseline (× baseline samples/s)")
        ax.set_title(title)
        ax.grid(axis="y", visible=False)
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2, fontsize=8)
        return _save(fig, path)


def _series_keys(sub: pd.DataFrame, x: str) -> list[str]:
    keys = []
    for key in SERIES_KEYS:
        if key == x:
            continue
        if sub[key].dropna().astype(str).nunique() > 1:
            keys.append(key)
    return keys


def plot_sweep(stats: pd.DataFrame, group: str, path: Path) -> str:
    x, xlabel, title = SWEEPS[group]
    title = f"{title} sweep: throughput vs. {xlabel.split(' (')[0]}"
    sub = stats[(stats["group"] == group) & stats["sps_median"].notna()].copy()
    sub["_x"] = pd.to_numeric(sub[x], errors="coerce").astype("float64")
    sub = sub[sub["_x"].notna()]
    if not len(sub):
        return _no_data(title, path)
    keys = _series_keys(sub, x)
    with plt.rc_context(STYLE):
        fig, ax = plt.subplots(figsize=(6.8, 4.0))
        if keys:
            groups = sub.groupby([sub[k].astype(str) for k in keys], sort=False)
        else:
            groups = [((), sub)]
        for label, part in groups:
            part = part.sort_values("_x", kind="stable")
            med = part["sps_median"].astype("float64")
            err = [
                (med - part["sps_min"].astype("float64")).clip(lower=0),
                (part["sps_max"].astype("float64") - med).clip(lower=0),
            ]
            if keys:
                values = label if isinstance(label, tuple) else (label,)
                name = ", ".join(f"{k}={v}" for k, v in zip(keys, values))
            else:
                name = "median (min–max)"
            ax.errorbar(part["_x"], med, yerr=err, marker="o", capsize=3, lw=1.5, label=name)
        xs = sorted(sub["_x"].unique())
        if min(xs) > 0 and max(xs) / min(xs) >= 8:
            ax.set_xscale("log", base=2)
            ax.xaxis.set_minor_locator(NullLocator())
        ax.xaxis.set_major_locator(FixedLocator(xs))
        fmt = ScalarFormatter()
        fmt.set_scientific(False)
        ax.xaxis.set_major_formatter(fmt)
        ax.set_ylim(bottom=0)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("throughput (samples/s)")
        ax.set_title(title)
        ax.legend(fontsize=8)
        return _save(fig, path)


def plot_backends(backends: pd.DataFrame, base: float, path: Path) -> str:
    """Bars of the best experiment per backend; backends with no ok trial are marked."""
    title = "Backends head-to-head: best experiment per backend"
    if not len(backends) or not backends["sps_median"].notna().any():
        return _no_data(title, path)
    with plt.rc_context(STYLE):
        fig, ax = plt.subplots(figsize=(max(5.0, 1.7 * len(backends) + 1.5), 4.0))
        xs = list(range(len(backends)))
        med = backends["sps_median"].astype("float64")
        err = [
            (med - backends["sps_min"].astype("float64")).clip(lower=0).fillna(0),
            (backends["sps_max"].astype("float64") - med).clip(lower=0).fillna(0),
        ]
        colors = [f"C{i % 10}" for i in xs]
        ax.bar(xs, med.fillna(0), color=colors, width=0.6, yerr=err, capsize=3, zorder=2)
        top = _nanmax(*(med + err[1]), base)
        ticks = []
        for xx, (_, r) in zip(xs, backends.iterrows()):
            if _isnan(r["sps_median"]):
                ticks.append(str(r["backend"]))
                ax.text(
                    xx,
                    0.02 * top,
                    "no successful\ntrial",
                    ha="center",
                    va="bottom",
                    fontsize=8,
                    color="#b00020",
                )
                continue
            ticks.append(f"{r['backend']}\n({r['experiment']})")
            note = fmt_speedup(r["speedup"])
            label = fmt_num(r["sps_median"]) + (f"\n{note}" if note else "")
            ax.text(xx, r["sps_median"] + 0.02 * top, label, ha="center", va="bottom", fontsize=8)
        if not _isnan(base):
            ax.axhline(base, color="#555555", ls="--", lw=1, label="baseline", zorder=1)
            ax.legend(fontsize=8, loc="upper left")
        ax.set_xticks(xs, ticks)
        ax.set_ylim(0, top * 1.25)
        ax.set_ylabel("throughput (samples/s)")
        ax.set_title(title)
        ax.grid(axis="x", visible=False)
        return _save(fig, path)


def roofline_frame(stats: pd.DataFrame) -> pd.DataFrame:
    """Experiments with a FLOP count: achieved GFLOP/s against the probe's matmul rate
    of the dtype they trained in (for bf16 autocast the faster of bf16 and fp32)."""
    rows = []
    for _, r in stats.iterrows():
        if _isnan(r["flops_per_sample"]):
            continue
        dtype = "fp32"  # bf16 autocast: the faster of the two probes (harness.peak_rate)
        if r["precision"] == "bf16" and not r["probe_bf16_gflops"] < r["probe_fp32_gflops"]:
            dtype = "bf16"
        rows.append(
            {
                "experiment": r["experiment"],
                "dtype": dtype,
                "flops_per_sample": r["flops_per_sample"],
                "samples_per_s": r["sps_median"],
                "achieved_gflops": r["achieved_gflops"],
                "peak_gflops": r[f"probe_{dtype}_gflops"],
                "pct_of_peak": r["pct_of_peak"],
            }
        )
    columns = ["experiment", "dtype", "flops_per_sample", "samples_per_s", "achieved_gflops"]
    return pd.DataFrame(rows, columns=[*columns, "peak_gflops", "pct_of_peak"])


def plot_roofline(roof: pd.DataFrame, path: Path) -> str:
    """A bar per experiment: achieved GFLOP/s as a % of the matmul probe of its dtype."""
    title = "Roofline: training FLOP/s as a share of the matmul probe's rate"
    roof = roof[pd.to_numeric(roof["pct_of_peak"], errors="coerce").notna()]
    if not len(roof):
        return _no_data(title, path)
    colors = {"fp32": "#1f77b4", "bf16": "#ff7f0e"}
    n = len(roof)
    with plt.rc_context(STYLE):
        fig, ax = plt.subplots(figsize=(7.5, max(2.6, 0.42 * n + 1.4)))
        y = list(range(n))
        pct = roof["pct_of_peak"].astype("float64")
        ax.barh(y, pct, height=0.6, color=[colors[d] for d in roof["dtype"]], zorder=2)
        xmax = _nanmax(*pct, 100.0)
        for yy, (_, r) in zip(y, roof.iterrows()):
            label = f"{r['pct_of_peak']:.0f}% ({fmt_num(r['achieved_gflops'])} GFLOP/s)"
            ax.text(r["pct_of_peak"] + 0.01 * xmax, yy, label, va="center", fontsize=8)
        ax.axvline(100.0, color="#555555", ls="--", lw=1, zorder=1)
        ax.set_yticks(y, [f"{e} ({d})" for e, d in zip(roof["experiment"], roof["dtype"])])
        ax.invert_yaxis()
        ax.set_xlim(0, xmax * 1.3)
        ax.set_xlabel("achieved GFLOP/s, % of the dense matmul probe of the same dtype")
        ax.set_title(title)
        ax.grid(axis="y", visible=False)
        handles = [
            matplotlib.patches.Patch(color=c, label=f"{d} (vs the {d} probe)")
            for d, c in colors.items()
            if d in set(roof["dtype"])
        ]
        ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2)
        return _save(fig, path)


# --------------------------------------------------------------------------- HTML

_XML_PROLOG = re.compile(r"<\?xml[^>]*\?>\s*|<!DOCTYPE[^>]*>\s*", re.DOTALL)
_XMLNS = re.compile(r'\s+xmlns(:\w+)?="[^"]*"')
_SVG_SIZE = re.compile(r'(<svg\b[^>]*?)\s+width="[^"]*"\s+height="[^"]*"')
_SVG_ID = re.compile(r'\bid="([^"]+)"')


def inline_svg(svg: str, prefix: str) -> str:
    """SVG text for embedding in HTML: no prolog or namespace URLs, ids made unique."""
    svg = _XML_PROLOG.sub("", svg)
    svg = _XMLNS.sub("", svg)
    size = re.search(r'<svg\b[^>]*?\swidth="([\d.]+)pt"', svg)
    width = f"{float(size.group(1)) * 4 / 3:.0f}px" if size else "100%"
    svg = _SVG_SIZE.sub(rf'\1 style="max-width:{width};width:100%;height:auto"', svg, count=1)
    ids = set(_SVG_ID.findall(svg))
    if ids:
        pattern = re.compile(
            r'(\bid="|url\(#|href="#)('
            + "|".join(map(re.escape, sorted(ids, key=len, reverse=True)))
            + r")\b"
        )
        svg = pattern.sub(lambda m: f"{m.group(1)}{prefix}-{m.group(2)}", svg)
    return svg.strip()


def caption_text(name: str) -> str:
    """The plot's caption file as plain text (reST literals and roles stripped)."""
    path = CAPTIONS_DIR / f"{name}.rst"
    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        return ""
    text = re.sub(r":\w+:`([^`]*)`", r"\1", text)
    text = text.replace("``", "").replace("`", "").replace("*", "")
    return " ".join(text.split())


def _figure(name: str, svg: str) -> str:
    cap = caption_text(name)
    caption = f"<figcaption>{html.escape(cap)}</figcaption>" if cap else ""
    return f'<figure id="fig-{name}">{inline_svg(svg, name)}{caption}</figure>'


CSS = """
body{font-family:-apple-system,"Segoe UI",Roboto,"Helvetica Neue",Arial,sans-serif;
 color:#222;max-width:1200px;margin:2em auto;padding:0 1.5em;line-height:1.45}
h1{font-size:1.7em;margin-bottom:.2em}h2{margin-top:2em;border-bottom:1px solid #ddd;
 padding-bottom:.2em}h3{margin-bottom:.3em}
nav ol{columns:2;font-size:.95em}
table.data{border-collapse:collapse;font-size:.85em;margin:.6em 0 1.2em}
table.data th,table.data td{border:1px solid #ddd;padding:3px 7px;text-align:left;
 vertical-align:top}
table.data thead th{background:#f3f5f7;position:sticky;top:0}
table.data tbody tr:nth-child(even){background:#fafafa}
table.kv th{width:14em}
.scroll{overflow:auto;max-height:70vh;border:1px solid #ddd}
.scroll table.data{margin:0;white-space:nowrap}
figure{margin:1em 0}figcaption{font-size:.85em;color:#555;max-width:60em}
pre{background:#f6f8fa;border:1px solid #e1e4e8;padding:.6em;overflow:auto;max-height:24em;
 font-size:.8em;white-space:pre-wrap}
.note{color:#555;font-size:.9em}.fail h3{color:#b00020;font-size:1em}
.counts b{font-size:1.1em}.empty{color:#777;font-style:italic}
"""

HOW_TO_READ = (
    "Each experiment trains the same model for a fixed number of steps after a warm-up "
    "and reports throughput in samples per second (higher is better). When an experiment "
    "ran several trials the report shows the median, with the min–max spread in "
    "parentheses and the coefficient of variation (CV: standard deviation / mean), over "
    "the trials not marked noisy (see Measurement noise). Speedups are ratios of median "
    "throughput to the baseline experiment ({baseline}). The article's claimed speedups "
    "were measured on a different, much larger machine, so compare the direction and "
    "rough size of each step rather than absolute numbers; results here depend on this "
    "machine's CPU, core count and ISA extensions (listed below). Failed trials are "
    "listed near the end with their errors."
)


def _uniq(series: pd.Series) -> list[str]:
    out: list[str] = []
    for v in series.dropna():
        s = fmt_text(v)
        if s and s not in out:
            out.append(s)
    return out


def provenance_html(frame: pd.DataFrame, records: Sequence[Mapping]) -> str:
    flags: list[str] = []
    for v in frame["cpu_flags"].dropna():
        for flag in str(v).split():
            if flag not in flags:
                flags.append(flag)
    kernels = []
    for r in records:
        prov = r.get("provenance") if isinstance(r, Mapping) else None
        k = prov.get("kernel") if isinstance(prov, Mapping) else None
        if k and str(k) not in kernels:
            kernels.append(str(k))
    revisions = []
    for rev, dirty in zip(frame["git_revision"], frame["git_dirty"]):
        if _isnan(rev):
            continue
        text = str(rev) + (" (dirty)" if dirty is True else "")
        if text not in revisions:
            revisions.append(text)
    started = sorted(_uniq(frame["started_at"]))
    items = [
        ("CPU model", ", ".join(_uniq(frame["cpu_model"]))),
        ("ISA flags (DL-relevant)", " ".join(flags)),
        ("logical CPUs", ", ".join(_uniq(frame["logical_cpus"]))),
        ("physical cores", ", ".join(_uniq(frame["physical_cores"]))),
        ("NUMA nodes", ", ".join(_uniq(frame["numa_nodes"]))),
        ("CPU affinity", ", ".join(_uniq(frame["affinity"]))),
        ("hosts", ", ".join(_uniq(frame["hostname"]))),
        ("kernel", ", ".join(kernels)),
        ("runtime", ", ".join(_uniq(frame["runtime"]))),
        ("git revision", ", ".join(revisions)),
        ("preset", ", ".join(_uniq(frame["preset"]))),
        ("started", " … ".join(dict.fromkeys(started[:1] + started[-1:]))),
    ]
    kv = pd.DataFrame(items, columns=["item", "value"])
    body = kv.to_html(index=False, header=False, escape=True, classes=["data", "kv"], border=0)

    version_rows = []
    envs = frame["env"].fillna("(unknown)")
    where = frame["image"].fillna("")  # container image, if any (eager/inductor share an env)
    for (env, image), sub in frame.groupby([envs, where], sort=False):
        row = {"env": env + (f" (image {image})" if image else "")}
        for col, label in (
            ("python_version", "python"),
            ("torch_version", "torch"),
            ("torchvision_version", "torchvision"),
            ("ipex_version", "ipex"),
            ("torch_xla_version", "torch_xla"),
            ("openmp_runtime", "OpenMP runtime"),
            ("image_id", "image ID"),
            ("image_digest", "image digest"),
        ):
            row[label] = ", ".join(_uniq(sub[col]))
        row["lock sha256"] = ", ".join(s[:12] for s in _uniq(sub["env_lock_sha256"]))
        if any(v for k, v in row.items() if k != "env"):
            version_rows.append(row)
    versions = pd.DataFrame(version_rows)
    return body + "<h3>Versions per environment</h3>" + _table(versions)


def failures_html(frame: pd.DataFrame, records: Sequence[Mapping]) -> str:
    blocks = []
    for i, row in frame.iterrows():
        if row["status"] == OK:
            continue
        record = records[i] if i < len(records) else {}
        etype, message, tail = error_parts(record)
        trial = fmt_int(row["trial"])
        head = f"{row['experiment']}" + (f" (trial {trial})" if trial else "")
        parts = [
            '<div class="fail">',
            f"<h3>{html.escape(head)} — {html.escape(fmt_text(row['status']))}</h3>",
            (
                f"<p><b>{html.escape(etype or 'error')}</b>: "
                f"{html.escape(message or 'no error message recorded')}</p>"
            ),
        ]
        if tail:
            parts.append(f"<pre>{html.escape(tail)}</pre>")
        parts.append("</div>")
        blocks.append("\n".join(parts))
    if not blocks:
        return '<p class="empty">No failed trials.</p>'
    return "\n".join(blocks)


def _ratio(a: Any, b: Any) -> str:
    if _isnan(a) or _isnan(b) or not float(b):
        return ""
    return f"{float(a) / float(b):.2f}"


def noise_html(frame: pd.DataFrame, records: Sequence[Mapping], threshold: float) -> str:
    """Which trials were noisy or rerun, and why: their probe against the median."""
    ok = frame["status"] == OK
    probed = ok & pd.to_numeric(frame["probe_fp32_gflops"], errors="coerce").notna()
    noisy = frame[frame["noisy"].fillna(False).astype(bool)]
    discarded = []
    for i, record in enumerate(records):
        attempts = record.get("discarded_attempts") if isinstance(record, Mapping) else None
        for a in attempts if isinstance(attempts, list) else []:
            a = a if isinstance(a, Mapping) else {}
            p = a.get("probe") if isinstance(a.get("probe"), Mapping) else {}
            discarded.append(
                {
                    "experiment": fmt_text(frame["experiment"].iloc[i]),
                    "trial": fmt_int(frame["trial"].iloc[i]),
                    "attempt": fmt_int(a.get("attempt")),
                    "probe fp32 (GFLOP/s)": fmt_num(p.get("fp32_gflops")),
                    "probe bf16 (GFLOP/s)": fmt_num(p.get("bf16_gflops")),
                    "samples/s": fmt_num(a.get("samples_per_s")),
                    "reason": fmt_text(a.get("reason")),
                }
            )
    intro = (
        f"<p>Just before its timed steps, each trial measures how fast its own process "
        f"multiplies dense matrices (the noise probe: fp32 and bf16 matmuls, about 0.3 s "
        f"each). A trial is marked <b>noisy</b> when either rate is below "
        f"<b>{threshold:g}</b> × the median of the ok trials measured the same way (same "
        f"environment, probe size and thread count): something else was using the CPU. "
        f"Noisy trials are left out of the medians, spreads and CVs of this report "
        f"(unless all of an experiment's ok trials are noisy: then they are used, and "
        f"flagged in the tables).</p>"
        f'<p class="counts"><b>{len(noisy)}</b> of <b>{int(probed.sum())}</b> ok trials '
        f"with a probe marked noisy; <b>{len(discarded)}</b> "
        f"attempt{'' if len(discarded) == 1 else 's'} discarded and rerun "
        f"by the launcher (their fp32 probe was below the threshold × the reference probe "
        f"measured when the study started); <b>{int((ok & ~probed).sum())}</b> ok trials "
        f"without a probe (probe_size 0, or older records).</p>"
    )
    rows = []
    for _, r in noisy.iterrows():
        rows.append(
            {
                "experiment": r["experiment"],
                "trial": fmt_int(r["trial"]),
                "samples/s": fmt_num(r["samples_per_s"]),
                "probe fp32": fmt_num(r["probe_fp32_gflops"]),
                "median fp32": fmt_num(r["probe_fp32_median_gflops"]),
                "fp32 ratio": _ratio(r["probe_fp32_gflops"], r["probe_fp32_median_gflops"]),
                "probe bf16": fmt_num(r["probe_bf16_gflops"]),
                "median bf16": fmt_num(r["probe_bf16_median_gflops"]),
                "bf16 ratio": _ratio(r["probe_bf16_gflops"], r["probe_bf16_median_gflops"]),
                "load avg 1 min": fmt_num(r["load_avg_1m"], 2),
            }
        )
    groups = []
    sub = frame[probed]
    for key, part in sub.groupby(noise_group_keys(sub), sort=False):
        groups.append(
            {
                "environment / probe size / threads": key,
                "ok trials": len(part),
                "noisy": int(part["noisy"].sum()),
                "median fp32 (GFLOP/s)": fmt_num(part["probe_fp32_gflops"].median()),
                "median bf16 (GFLOP/s)": fmt_num(part["probe_bf16_gflops"].median()),
            }
        )
    return (
        intro
        + "<h3>Noisy trials (probe rates in GFLOP/s)</h3>"
        + (_table(pd.DataFrame(rows)) if rows else '<p class="empty">No noisy trials.</p>')
        + "<h3>Attempts discarded by the launcher</h3>"
        + (
            _table(pd.DataFrame(discarded))
            if discarded
            else '<p class="empty">No attempts discarded.</p>'
        )
        + "<h3>Probe medians per comparison group</h3>"
        + (_table(pd.DataFrame(groups)) if groups else '<p class="empty">No probes.</p>')
    )


def roofline_display(roof: pd.DataFrame) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "experiment": roof["experiment"],
            "dtype": roof["dtype"],
            "GFLOP per sample": [fmt_num(v / 1e9, 3) for v in roof["flops_per_sample"]],
            "samples/s": [fmt_num(v) for v in roof["samples_per_s"]],
            "achieved GFLOP/s": [fmt_num(v) for v in roof["achieved_gflops"]],
            "probe GFLOP/s (same dtype)": [fmt_num(v) for v in roof["peak_gflops"]],
            "% of probe": [fmt_num(v, 1) for v in roof["pct_of_peak"]],
        }
    )


def build_report(
    records: Sequence[Mapping],
    summary_path: Path,
    html_path: Path,
    plots_dir: Path,
    prices: Any = None,
    title: str = DEFAULT_TITLE,
    noise_threshold: float = DEFAULT_NOISE_THRESHOLD,
) -> dict:
    """Write the summary CSV, the plots (:data:`PLOT_NAMES`) and the HTML page; return
    counts."""
    summary_path, html_path, plots_dir = Path(summary_path), Path(html_path), Path(plots_dir)
    for folder in (summary_path.parent, html_path.parent, plots_dir):
        folder.mkdir(parents=True, exist_ok=True)
    records = list(records)
    frame = summary_frame(records, noise_threshold)
    frame.to_csv(summary_path, index=False)
    price_list = parse_prices(prices)

    stats = experiment_stats(frame)
    baseline = pick_baseline(stats)
    base = baseline_sps(stats, baseline)
    stats_sp = with_group_speedup(with_speedup(stats, base))
    ladder = ladder_frame(stats, baseline)
    backends = backend_frame(stats, baseline)
    costs = cost_frame(stats, baseline, price_list)

    svgs = {"ladder": plot_ladder(ladder, plots_dir / "ladder.svg", baseline)}
    for group in SWEEPS:
        svgs[group] = plot_sweep(stats, group, plots_dir / f"{group}.svg")
    svgs["backends"] = plot_backends(backends, base, plots_dir / "backends.svg")
    roof = roofline_frame(stats)
    svgs["roofline"] = plot_roofline(roof, plots_dir / "roofline.svg")

    n = len(frame)
    n_ok = int((frame["status"] == OK).sum())
    n_failed = n - n_ok
    status_counts = frame["status"].value_counts(sort=False)
    counts = ", ".join(f"{k}: {v}" for k, v in status_counts.items())

    sections: list[tuple[str, str, str]] = []
    base_label = baseline if baseline is not None else "none found"
    base_note = f"Baseline: <b>{html.escape(str(base_label))}</b>"
    if not _isnan(base):
        base_note += f" at {html.escape(fmt_num(base))} samples/s."
    else:
        base_note += " (no ok trials, so no speedups)."
    sections.append(
        (
            "ladder",
            "Optimization ladder",
            f"<p>{base_note}</p>"
            + _table(ladder_display(ladder))
            + _figure("ladder", svgs["ladder"]),
        )
    )
    for group, (x, _xlabel, name) in SWEEPS.items():
        sub = stats_sp[stats_sp["group"] == group].copy()
        sub["_x"] = pd.to_numeric(sub[x], errors="coerce")
        sub = sub.sort_values("_x", kind="stable")
        sections.append(
            (
                group,
                f"Sweep: {name}",
                _group_note(sub, baseline)
                + _table(generic_display(sub))
                + _figure(group, svgs[group]),
            )
        )

    bk_rows = []
    for _, r in backends.iterrows():
        bk_rows.append(
            {
                "backend": r["backend"],
                "best experiment": fmt_text(r["experiment"]) or "no successful trial",
                "env": fmt_text(r["env"]),
                "torch": fmt_text(r["torch_version"]),
                "ipex": fmt_text(r["ipex_version"]),
                "torch_xla": fmt_text(r["torch_xla_version"]),
                "precision": fmt_text(r["precision"]),
                "compile": fmt_text(r["compile"]),
                "ok trials": _trials(r) if fmt_text(r["experiment"]) else "",
                "samples/s": fmt_spread(r["sps_median"], r["sps_min"], r["sps_max"], _n_used(r)),
                "CV": fmt_cv(r["sps_cv"]),
                "speedup vs baseline": fmt_speedup(r["speedup"]),
            }
        )
    sections.append(
        (
            "backends",
            "Backend head-to-head",
            _table(pd.DataFrame(bk_rows)) + _figure("backends", svgs["backends"]),
        )
    )
    roof_note = (
        '<p class="note">FLOPs per sample: one forward + backward pass of the model at '
        "batch size 1, counted by torch.utils.flop_counter (2 FLOPs per multiply-add of "
        "the convolutions and matrix products; normalization and activations are not "
        "counted). Achieved GFLOP/s = FLOPs per sample × samples/s; its share of the "
        "noise probe's dense matmul rate (same process, same threads, same dtype) says "
        "how far the training step is from what the matrix units deliver here.</p>"
    )
    sections.append(
        (
            "roofline",
            "Roofline",
            roof_note
            + (_table(roofline_display(roof)) if len(roof) else "")
            + _figure("roofline", svgs["roofline"]),
        )
    )
    sections.append(("noise", "Measurement noise", noise_html(frame, records, noise_threshold)))

    cost_note = (
        '<p class="note">Prices come from the workflow configuration, not from a live '
        "price list. Samples per dollar = samples/s × 3600 / (USD per hour): what the "
        "throughput measured here would buy at that hourly rate.</p>"
    )
    if len(costs):
        cost_display = pd.DataFrame(
            {
                "instance": costs["name"],
                "USD/hour": [fmt_num(v, 3) for v in costs["usd_per_hour"]],
                "note": costs["note"],
                f"baseline ({baseline}) samples/$": [
                    fmt_num(v, 0) for v in costs["baseline_samples_per_usd"]
                ],
                "best experiment": costs["best"].map(fmt_text),
                "best samples/$": [fmt_num(v, 0) for v in costs["best_samples_per_usd"]],
            }
        )
        cost_body = cost_note + _table(cost_display)
    else:
        cost_body = cost_note + '<p class="empty">No prices configured.</p>'
    sections.append(("cost", "Cost", cost_body))

    other = []
    groups = stats_sp["group"].fillna("(none)")
    for group in dict.fromkeys(groups):
        if group in COVERED_GROUPS:
            continue
        sub = stats_sp[groups == group]
        other.append(
            f"<h3>{html.escape(str(group))}</h3>"
            + _group_note(sub, baseline)
            + _table(generic_display(sub))
        )
    sections.append(
        ("other", "Other groups", "\n".join(other) or '<p class="empty">No other groups.</p>')
    )
    sections.append(("failures", "Failures", failures_html(frame, records)))
    full = frame.to_html(
        index=False,
        escape=True,
        na_rep="",
        classes=["data"],
        border=0,
        float_format=lambda v: f"{v:.4g}",
    )
    sections.append(("summary", "Full summary", f'<div class="scroll">{full}</div>'))

    nav = "".join(
        f'<li><a href="#{sid}">{html.escape(heading)}</a></li>' for sid, heading, _ in sections
    )
    body = "\n".join(
        f'<section id="{sid}"><h2>{html.escape(heading)}</h2>\n{content}</section>'
        for sid, heading, content in sections
    )
    how = HOW_TO_READ.format(baseline=html.escape(str(base_label)))
    page = f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{html.escape(title)}</title>
<style>{CSS}</style>
</head>
<body>
<header>
<h1>{html.escape(title)}</h1>
<p>{how}</p>
<p class="counts"><b>{n}</b> trials of <b>{len(stats)}</b> experiments: <b>{n_ok}</b> ok,
<b>{n_failed}</b> failed ({html.escape(counts) if n else "none"}).</p>
<h2 id="provenance">Run provenance</h2>
{provenance_html(frame, records)}
<nav><ol>{nav}</ol></nav>
</header>
{body}
</body>
</html>
"""
    html_path.write_text(page, encoding="utf-8")
    return {"trials": n, "ok": n_ok, "failed": n_failed, "baseline": baseline}


def run_rule(
    records, summary, html, prices_json: str, log, noise_threshold=DEFAULT_NOISE_THRESHOLD
) -> int:
    """The report rule's call: plots go next to the HTML file."""
    return main(
        ["--records", *map(str, records), f"--summary={summary}", f"--html={html}",
         f"--plots-dir={Path(html).parent}", f"--prices-json={prices_json}", f"--log={log}",
         f"--noise-threshold={noise_threshold}"]
    )  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", nargs="*", default=[], help="trial record JSON files")
    parser.add_argument("--summary", required=True, type=Path, help="summary CSV to write")
    parser.add_argument("--html", required=True, type=Path, help="HTML report to write")
    parser.add_argument("--plots-dir", required=True, type=Path, help="folder for the SVG plots")
    parser.add_argument(
        "--prices-json", default="[]", help="JSON list of {name, usd_per_hour, note}"
    )
    parser.add_argument(
        "--noise-threshold",
        type=float,
        default=DEFAULT_NOISE_THRESHOLD,
        help="a trial is noisy when its probe is below this fraction of comparable trials' median",
    )
    parser.add_argument("--title", default=DEFAULT_TITLE)
    parser.add_argument("--log", type=Path, default=None, help="also append the result line here")
    args = parser.parse_args(argv)
    try:
        prices = parse_prices(args.prices_json)
    except (ValueError, TypeError) as exc:
        parser.error(f"--prices-json is not valid JSON: {exc}")
    records = load_records(args.records)
    result = build_report(
        records, args.summary, args.html, args.plots_dir, prices, args.title, args.noise_threshold
    )
    line = f"report: {args.html} ({result['trials']} trials, {result['failed']} failed)"
    announce(line, args.log)
    return 0


if __name__ == "__main__":
    sys.exit(main())
