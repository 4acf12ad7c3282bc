"""The report's plots (matplotlib, written as SVG) and the SVG helper that inlines them
in the HTML page."""

from __future__ import annotations

import io
import math
import re
from pathlib import Path
from typing import Any

import matplotlib
import matplotlib.lines
import matplotlib.patches
import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.ticker import FixedLocator, NullLocator, ScalarFormatter

from ..spec import fields
from .formatting import fmt_num
from .stats import SWEEPS
from .values import isnan

matplotlib.use("Agg")  # no display; pyplot picks the backend lazily, so this is in time

PLOT_NAMES = ("ladder", "batch_size", "num_workers", "threads", "backends", "ceiling")
NO_DATA = "no successful trials in this group"
NOT_RUN = "not run in this preset"
# Figure widths in inches: the page is about 1150 px wide, so are the wide figures.
WIDE = 11.5
# Settings that may differ between the experiments of one sweep; those that do
# split the sweep into several lines (spec/fields.py: a field's ``series``).
SERIES_KEYS = fields.series_keys()

STYLE = {
    "font.size": 11,
    "axes.titlesize": 12,
    "axes.titleweight": "bold",
    "axes.labelsize": 11,
    "xtick.labelsize": 10,
    "ytick.labelsize": 10,
    "legend.fontsize": 10,
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


def save_svg(fig: plt.Figure, path: Path) -> str:
    buf = io.StringIO()
    fig.savefig(buf, format="svg", metadata=SVG_METADATA, bbox_inches="tight")
    plt.close(fig)
    text = buf.getvalue()
    path.write_text(text, encoding="utf-8")
    return text


def no_data_svg(title: str, path: Path, text: str = NO_DATA) -> str:
    with plt.rc_context(STYLE):
        fig, ax = plt.subplots(figsize=(6.4, 1.6))
        ax.set_axis_off()
        ax.set_title(title)
        ax.text(0.5, 0.5, text, ha="center", va="center", fontsize=12, color="#666666")
        return save_svg(fig, path)


def not_run_svg(title: str, path: Path, text: str = NOT_RUN) -> str:
    """A small figure that says why there is none (the plot files always exist)."""
    return no_data_svg(title, path, text)


def nanmax(*values: Any) -> float:
    finite = [float(v) for v in values if not isnan(v)]
    return max(finite) if finite else math.nan


def plot_ladder(ladder: pd.DataFrame, path: Path, baseline: str | None = None) -> str:
    """Bars of each ladder step's speedup over the baseline, labelled with the speedup
    over the step it builds on (``step_speedup``/``step_parent`` when present), and
    the article's claims as labelled diamonds."""
    title = "Optimization ladder: measured speedup vs. the article's claim"
    if not ladder["speedup"].notna().any():
        return no_data_svg(title, path)
    n = len(ladder)
    measured, base_color, claim_color = "#1f77b4", "#9e9e9e", "#d62728"
    with plt.rc_context(STYLE):
        fig, ax = plt.subplots(figsize=(WIDE, max(2.8, 0.55 * n + 1.6)))
        y = list(range(n))
        speed = ladder["speedup"].astype("float64")
        lo = (speed - ladder["speedup_min"].astype("float64")).clip(lower=0).fillna(0)
        hi = (ladder["speedup_max"].astype("float64") - speed).clip(lower=0).fillna(0)
        colors = [base_color if e == baseline else measured for e in ladder["experiment"]]
        ax.barh(
            y,
            speed.fillna(0),
            height=0.55,
            color=colors,
            xerr=[lo, hi],
            error_kw={"ecolor": "#333333", "capsize": 3, "lw": 1},
            zorder=2,
        )
        claims = ladder["claim_speedup"].astype("float64")
        has_claim = claims.notna()
        if has_claim.any():
            ax.scatter(
                claims[has_claim],
                [yy for yy, c in zip(y, has_claim) if c],
                marker="D",
                s=40,
                color=claim_color,
                zorder=3,
            )
        xmax = nanmax(*(speed + hi), *claims, 1.0)
        ax.set_xlim(0, xmax * 1.55)
        renderer = fig.canvas.get_renderer()
        parents = ladder["step_parent"] if "step_parent" in ladder else [None] * n
        steps = ladder["step_speedup"] if "step_speedup" in ladder else [math.nan] * n
        for yy, s, lo_i, h, c, parent, step in zip(y, speed, lo, hi, claims, parents, steps):
            if isnan(s):
                ax.text(0.02 * xmax, yy, "no ok trials", va="center", fontsize=10, color="#b00020")
                continue
            text = f"{s:.2f}×"
            if not isnan(step) and parent and parent != baseline:
                text += f"  ({step:.2f}× over {parent})"
            inside = None
            if s > 0.45 * xmax:  # inside the bar's end, clear of whiskers and claims
                inside = ax.text(s - lo_i - 0.015 * xmax, yy, text, va="center", ha="right",
                                 fontsize=10, color="white", fontweight="bold")  # fmt: skip
                # ... where it fits: a long label on a short bar would run off its start
                start = ax.transData.transform((0.015 * xmax, yy))[0]
                if inside.get_window_extent(renderer).x0 < start:
                    inside.remove()
                    inside = None
            if inside is None:  # after the bar and after its claim's diamond
                right = max(s + h, c + 0.04 * xmax if not isnan(c) and c > s else 0)
                ax.text(right + 0.015 * xmax, yy, text, va="center", fontsize=10)
            if not isnan(c):
                ax.text(c, yy - 0.36, f"claim {c:.2f}×", ha="center", va="bottom",
                        fontsize=9, color=claim_color)  # fmt: skip
        ax.axvline(1.0, color="#555555", ls="--", lw=1, zorder=1)
        ax.set_yticks(y, [str(e) for e in ladder["experiment"]])
        ax.invert_yaxis()
        ax.set_xlabel("speedup over the baseline (× its samples/s)")
        ax.set_title(title)
        ax.grid(axis="y", visible=False)
        handles = [
            matplotlib.patches.Patch(color=measured, label="measured speedup (median, min–max)"),
            matplotlib.patches.Patch(color=base_color, label=f"baseline ({baseline})"),
        ]
        if has_claim.any():
            handles.append(
                matplotlib.lines.Line2D(
                    [], [], marker="D", ls="", color=claim_color, label="article's claim"
                )
            )
        ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.12),
                  ncol=len(handles))  # fmt: skip
        return save_svg(fig, path)


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
    if not (stats["group"] == group).any():
        return not_run_svg(title, path)
    sub = stats[(stats["group"] == group) & stats["sps_median"].notna()].copy()
    sub["_x"] = pd.to_numeric(sub[x], errors="coerce").astype("float64")
    sub = sub[sub["_x"].notna()]
    if not len(sub):
        return no_data_svg(title, path)
    keys = _series_keys(sub, x)
    with plt.rc_context(STYLE):
        fig, ax = plt.subplots(figsize=(WIDE, 4.2))
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
        ax.legend()
        return save_svg(fig, path)


def plot_backends(matrix: pd.DataFrame, order: list[str], path: Path) -> str:
    """Grouped bars: per configuration that several backends ran (like for like), one
    bar per backend variant, labelled with samples/s and the ratio to eager."""
    title = "Backends head-to-head at the same configuration"
    if not len(matrix) or not matrix["sps_median"].notna().any():
        return no_data_svg(title, path, "no configuration that two backends ran")
    configs = list(dict.fromkeys(matrix["config"]))
    n, k = len(configs), max(1, len(order))
    with plt.rc_context(STYLE):
        fig, ax = plt.subplots(figsize=(WIDE, max(3.0, n * (0.42 * k + 0.5) + 1.4)))
        height = 0.8 / k
        colors = {v: f"C{i % 10}" for i, v in enumerate(order)}
        top = nanmax(*(matrix["sps_max"].astype("float64")), *(matrix["sps_median"]))
        for ci, config in enumerate(configs):
            part = matrix[matrix["config"] == config].set_index("variant")
            for vi, v in enumerate(order):
                if v not in part.index:
                    continue
                r = part.loc[v]
                yy = ci + (vi - (k - 1) / 2) * height
                med = r["sps_median"]
                if isnan(med):
                    ax.text(0.01 * top, yy, f"{v}: no ok trial", va="center", fontsize=10,
                            color="#b00020")  # fmt: skip
                    continue
                lo = 0.0 if isnan(r["sps_min"]) else max(0.0, med - r["sps_min"])
                hi = 0.0 if isnan(r["sps_max"]) else max(0.0, r["sps_max"] - med)
                err = [[lo], [hi]]
                whisker = {"ecolor": "#333333", "capsize": 2, "lw": 1}
                ax.barh(yy, med, height=height * 0.9, color=colors[v], xerr=err,
                        error_kw=whisker, zorder=2)  # fmt: skip
                label = f"{fmt_num(med)}"
                if not isnan(r["vs_eager"]) and v != "eager":
                    label += f" ({r['vs_eager']:.2f}× eager)"
                ax.text(med + err[1][0] + 0.01 * top, yy, label, va="center", fontsize=10)
        ax.set_yticks(range(n), [_wrap(c) for c in configs])
        ax.set_ylim(n - 0.5, -0.5)  # inverted, and holding the "no ok trial" notes
        ax.set_xlim(0, top * 1.3)
        ax.set_xlabel("throughput (samples/s, median; whiskers min–max)")
        ax.set_title(title)
        ax.grid(axis="y", visible=False)
        handles = [matplotlib.patches.Patch(color=colors[v], label=v) for v in order]
        ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.12),
                  ncol=min(len(handles), 5))  # fmt: skip
        return save_svg(fig, path)


def _wrap(text: str, width: int = 34) -> str:
    words, lines, line = text.split(", "), [], ""
    for w in words:
        candidate = f"{line}, {w}" if line else w
        if len(candidate) > width and line:
            lines.append(line + ",")
            line = w
        else:
            line = candidate
    return "\n".join([*lines, line])


def plot_ceiling(roof: pd.DataFrame, path: Path) -> str:
    """A bar per experiment: achieved GFLOP/s as a % of the measured dense ceiling of
    its dtype (its measurement error instead where it has one)."""
    title = "Training FLOP/s as a % of the measured ceiling"
    roof = roof[pd.to_numeric(roof["pct_of_peak"], errors="coerce").notna()]
    if not len(roof):
        return no_data_svg(title, path, "no experiment with a FLOP count and a ceiling")
    colors = {"fp32": "#1f77b4", "bf16": "#ff7f0e"}
    n = len(roof)
    with plt.rc_context(STYLE):
        fig, ax = plt.subplots(figsize=(WIDE, max(2.8, 0.42 * n + 1.6)))
        y = list(range(n))
        pct = roof["pct_of_peak"].astype("float64")
        ax.barh(y, pct, height=0.6, color=[colors.get(d, "#777777") for d in roof["dtype"]],
                zorder=2)  # fmt: skip
        xmax = nanmax(*pct, 100.0)
        for yy, (_, r) in zip(y, roof.iterrows()):
            label = (
                f"{r['pct_of_peak']:.0f}% ({fmt_num(r['achieved_gflops'])} of "
                f"{fmt_num(r['peak_gflops'])} GFLOP/s)"
            )
            ax.text(r["pct_of_peak"] + 0.01 * xmax, yy, label, va="center", fontsize=10)
        ax.axvline(100.0, color="#555555", ls="--", lw=1, zorder=1)
        ax.set_yticks(y, [f"{e} ({d})" for e, d in zip(roof["experiment"], roof["dtype"])])
        ax.invert_yaxis()
        ax.set_xlim(0, xmax * 1.35)
        ax.set_xlabel("achieved GFLOP/s as a % of the measured dense-matmul rate, same dtype")
        ax.set_title(title)
        ax.grid(axis="y", visible=False)
        handles = [
            matplotlib.patches.Patch(color=c, label=f"{d} (vs the {d} ceiling)")
            for d, c in colors.items()
            if d in set(roof["dtype"])
        ]
        ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=2)
        return save_svg(fig, path)


def plot_all(
    stats: pd.DataFrame,
    ladder: pd.DataFrame,
    matrix: pd.DataFrame,
    order: list[str],
    roof: pd.DataFrame,
    baseline: str | None,
    plots_dir: Path,
) -> dict[str, str]:
    """Write every plot of :data:`PLOT_NAMES` to ``plots_dir/<name>.svg``; return the
    SVG texts by name."""
    svgs = {"ladder": plot_ladder(ladder, plots_dir / "ladder.svg", baseline)}
    for group in SWEEPS:
        svgs[group] = plot_sweep(stats, group, plots_dir / f"{group}.svg")
    svgs["backends"] = plot_backends(matrix, order, plots_dir / "backends.svg")
    svgs["ceiling"] = plot_ceiling(roof, plots_dir / "ceiling.svg")
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
