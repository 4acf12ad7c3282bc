"""The report's plots (matplotlib, written as SVG) and the SVG helper that inlines them
in the HTML page."""

from __future__ import annotations

import io
import math
import re
from pathlib import Path
from typing import Any

import matplotlib
import matplotlib.patches
import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.ticker import FixedLocator, NullLocator, ScalarFormatter

from .formatting import fmt_num, fmt_speedup
from .stats import SWEEPS, _isnan

matplotlib.use("Agg")  # no display; pyplot picks the backend lazily, so this is in time

PLOT_NAMES = ("ladder", "batch_size", "num_workers", "threads", "backends", "roofline")
NO_DATA = "no successful trials in this group"
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


def plot_all(
    stats: pd.DataFrame,
    ladder: pd.DataFrame,
    backends: pd.DataFrame,
    roof: pd.DataFrame,
    base: float,
    baseline: str | None,
    plots_dir: Path,
) -> dict[str, str]:
    """Write every plot of :data:`PLOT_NAMES` to ``plots_dir/<name>.svg``; return the
    SVG texts by name."""
    svgs = {"ladder": plot_ladder(ladder, plots_dir / "ladder.svg", baseline)}
    for group in SWEEPS:
        svgs[group] = plot_sweep(stats, group, plots_dir / f"{group}.svg")
    svgs["backends"] = plot_backends(backends, base, plots_dir / "backends.svg")
    svgs["roofline"] = plot_roofline(roof, plots_dir / "roofline.svg")
    return svgs


# --------------------------------------------------------------------------- inlining

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
