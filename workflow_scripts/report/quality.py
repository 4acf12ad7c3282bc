"""Beyond throughput: does a configuration still train the same model (its losses
against the fp32 eager run of the same workload, seed and batch), what does it cost
to start (setup, the first step with its compilation), and how much memory does it
take against that reference."""

from __future__ import annotations

import html
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import pandas as pd

from ..spec import fields
from .compare import is_reference, norm_setting, reference_for
from .figures import STYLE, WIDE, inline_svg, nanmax, not_run_svg, save_svg
from .formatting import fmt_num, fmt_text
from .html import table_html
from .values import isnan

# Runs that must train identically step by step (the same data in the same order from
# the same initial weights): the fields whose registry entry says they change the
# trajectory (the workload, batch, data, seed, learning rate, ranks, DataLoader workers
# and any knob added without saying otherwise).
LOSS_KEYS = fields.trajectory_keys()
# A curve's largest relative deviation from its reference (block means, see
# :func:`loss_deviation`): up to MATCH it matches, up to DRIFT it drifts, beyond it
# (or any non-finite loss) it diverges.
MATCH, DRIFT = 0.02, 0.10
BLOCKS = 10
# Blocks of at least 3 steps: from scratch on one batch, a ResNet-50's loss jumps by
# 20% from one step to the next (7.3, 6.6, 12.3, 9.2), and bf16 with it a step
# earlier or later; a run gone wrong stays off for several steps.
MIN_BLOCK = 3


def _key(row: Mapping) -> tuple[str, ...]:
    return tuple(norm_setting(k, row.get(k)) for k in LOSS_KEYS)


def loss_deviation(curve: Sequence[float], ref: Sequence[float]) -> tuple[float, int, str]:
    """(largest deviation, at which step, note) of ``curve`` from ``ref`` over their
    common steps, compared as the means of up to :data:`BLOCKS` consecutive blocks
    (at least :data:`MIN_BLOCK` steps, a short last one joining the block before it;
    minibatch noise averages out in them), relative
    to the reference's starting loss (so that small late losses do not inflate it). A
    non-finite loss is an infinite deviation."""
    n = min(len(curve), len(ref))
    if not n:
        return math.nan, -1, "no common steps"
    for i in range(n):
        if not math.isfinite(curve[i]):
            return math.inf, i, f"non-finite loss at step {i}"
    size = max(MIN_BLOCK, math.ceil(n / BLOCKS))
    worst, at = 0.0, 0
    scale = abs(sum(ref[:size]) / len(ref[:size]))  # the reference's starting loss
    starts = list(range(0, n, size))
    if len(starts) > 1 and n - starts[-1] < size:
        starts.pop()  # a short last block joins the one before it
    for start, end in zip(starts, [*starts[1:], n]):
        a = sum(curve[start:end]) / (end - start)
        b = sum(ref[start:end]) / (end - start)
        if not math.isfinite(b) or not scale:
            continue
        dev = abs(a - b) / scale
        if dev > worst:
            worst, at = dev, start
    return worst, at, f"{n} steps" + (f" in blocks of {size}" if size > 1 else "")


def verdict(dev: float) -> str:
    if isnan(dev):
        return "n/a"
    if dev <= MATCH:
        return "matches"
    if dev <= DRIFT:
        return "drifts"
    return "diverges"


def loss_check(
    stats: pd.DataFrame, frame: pd.DataFrame, curves: Mapping[int, list[float]]
) -> pd.DataFrame:
    """Per experiment with a loss curve: its reference (the first plain fp32 eager
    experiment of the same :data:`LOSS_KEYS`), the largest deviation and the verdict.
    Each experiment's curve is that of its first ok trial."""
    first_curve: dict[str, list[float]] = {}
    for i, curve in curves.items():
        first_curve.setdefault(str(frame["experiment"].iloc[i]), curve)
    refs: dict[tuple, str] = {}
    for _, r in stats.iterrows():
        if r["experiment"] in first_curve and is_reference(r):
            refs.setdefault(_key(r), r["experiment"])
    rows = []
    for _, r in stats.iterrows():
        exp = r["experiment"]
        if exp not in first_curve:
            continue
        ref = refs.get(_key(r))
        row = {"experiment": exp, "reference": ref, "steps": len(first_curve[exp])}
        if ref is None:
            row.update(deviation=math.nan, step=-1, note="no fp32 eager run of this setup")
        elif ref == exp:
            row.update(deviation=0.0, step=-1, note="reference")
        else:
            dev, step, note = loss_deviation(first_curve[exp], first_curve[ref])
            row.update(deviation=dev, step=step, note=note)
        row["verdict"] = "reference" if ref == exp else verdict(row["deviation"])
        row["final_loss"] = first_curve[exp][-1]
        row["reference_final_loss"] = first_curve[ref][-1] if ref else math.nan
        rows.append(row)
    columns = ["experiment", "reference", "steps", "deviation", "step", "note", "verdict"]
    return pd.DataFrame(rows, columns=[*columns, "final_loss", "reference_final_loss"])


def loss_display(check: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for _, c in check.iterrows():
        dev = c["deviation"]
        rows.append(
            {
                "experiment": c["experiment"],
                "reference (fp32 eager)": fmt_text(c["reference"]) or "none",
                "steps compared": c["note"] if c["verdict"] != "reference" else "",
                "largest deviation": "∞"
                if dev == math.inf
                else ("" if isnan(dev) or c["verdict"] == "reference" else f"{100 * dev:.1f}%"),
                "at step": "" if c["step"] < 0 or not dev else str(int(c["step"])),
                "final loss (reference)": fmt_num(c["final_loss"], 3)
                + (
                    f" ({fmt_num(c['reference_final_loss'], 3)})"
                    if c["verdict"] != "reference" and not isnan(c["reference_final_loss"])
                    else ""
                ),
                "verdict": c["verdict"],
            }
        )
    return pd.DataFrame(rows)


def plot_losses(
    check: pd.DataFrame, frame: pd.DataFrame, curves: Mapping[int, list[float]], path: Path
) -> str:
    """Loss curves of every checked setup with a reference, one panel per reference
    (at most three, the largest first)."""
    first_curve: dict[str, list[float]] = {}
    for i, curve in curves.items():
        first_curve.setdefault(str(frame["experiment"].iloc[i]), curve)
    sets = check[check["reference"].notna()].groupby("reference", sort=False)
    panels = sorted(sets, key=lambda kv: -len(kv[1]))[:3]
    panels = [p for p in panels if len(p[1]) > 1]
    if not panels:
        return not_run_svg("Loss curves against the fp32 eager reference", path, "no pairs")
    with plt.rc_context(STYLE):
        fig, axes = plt.subplots(
            1, len(panels), figsize=(WIDE, 3.6), squeeze=False, constrained_layout=True
        )
        for ax, (ref, part) in zip(axes[0], panels):
            for _, c in part.iterrows():
                curve = first_curve[c["experiment"]]
                is_ref = c["experiment"] == ref
                style = {"lw": 2.6, "color": "#222222", "zorder": 3} if is_ref else {"lw": 1.4}
                if c["verdict"] == "diverges":
                    style.update(ls="--", color="#b00020")
                label = f"{c['experiment']}" + ("" if is_ref else f" ({c['verdict']})")
                ax.plot(range(len(curve)), curve, label=label, **style)
            ax.set_title(f"against {ref}", fontsize=11)
            ax.set_xlabel("step (warm-up included)")
            ax.set_ylabel("training loss")
            ax.legend(fontsize=9)
        return save_svg(fig, path)


def correctness_section(
    stats: pd.DataFrame, frame: pd.DataFrame, curves: Mapping[int, list[float]], plots_dir: Path
) -> tuple[tuple[str, str, str], pd.DataFrame]:
    check = loss_check(stats, frame, curves)
    note = (
        '<p class="note">Every run trains from the same seed, so two runs of the same '
        "model, image size, batch, data, learning rate and ranks see the same data from "
        "the same initial weights, and their losses should follow the same curve. Each "
        "curve (its first ok trial, warm-up steps included) is compared with that of the "
        "plain fp32 eager run of the same setup: the largest difference of the losses "
        f"(means of up to {BLOCKS} blocks of steps) relative to the reference's starting "
        f"loss: <b>matches</b> up to "
        f"{100 * MATCH:g}%, <b>drifts</b> up to {100 * DRIFT:g}% (expected of bf16 over "
        "many steps), <b>diverges</b> beyond that or with a non-finite loss: a "
        "configuration (a precision, a compiler, an optimizer rewrite) that no longer "
        "trains the same model. A transformer trained with dropout runs its first step "
        "without it (the gradient check's); after that, a run that draws its random "
        "numbers otherwise than eager (a compiled one) drops other activations, and its "
        "curve may drift by dropout's own noise.</p>"
    )
    if check.empty:
        return ("correctness", "Correctness: losses against fp32 eager", note
                + '<p class="empty">No loss curves recorded.</p>'), check  # fmt: skip
    svg = plot_losses(check, frame, curves, Path(plots_dir) / "losses.svg")
    bad = check[check["verdict"] == "diverges"]
    n_checked = int(check["verdict"].isin(["matches", "drifts", "diverges"]).sum())
    summary = (
        f'<p class="counts"><b>{len(bad)}</b> of <b>{n_checked}</b> '
        "checked configurations diverge"
        + (f": {html.escape(', '.join(bad['experiment']))}" if len(bad) else "")
        + ".</p>"
    )
    body = note + summary + table_html(loss_display(check))
    body += f'<figure id="fig-losses">{inline_svg(svg, "losses")}</figure>'
    return ("correctness", "Correctness: losses against fp32 eager", body), check


def startup_frame(stats: pd.DataFrame, baseline: str | None) -> pd.DataFrame:
    """Per experiment with a first step: setup, first step, its one-off cost over a
    median step (compilation, allocation, warm caches), peak memory and its ratio to the
    fp32 eager reference of the same workload."""
    rows = []
    for _, r in stats.iterrows():
        first = r["time_to_first_step_s"]
        if isnan(first) and isnan(r["peak_rss_mb"]):
            continue
        ref = reference_for(stats, r, baseline)
        median = r["step_time_median_s"]
        extra = first - median if not (isnan(first) or isnan(median)) else math.nan
        ref_rss = math.nan if ref is None else ref["peak_rss_mb"]
        ref_extra = math.nan
        if ref is not None and not isnan(ref["time_to_first_step_s"]):
            ref_extra = ref["time_to_first_step_s"] - ref["step_time_median_s"]
        rows.append(
            {
                "experiment": r["experiment"],
                "compiled": norm_setting("compile", r["compile"]) not in ("", "none"),
                "reference": None if ref is None else ref["experiment"],
                "setup_s": r["setup_s"],
                "first_step_s": first,
                "step_median_s": median,
                "one_off_s": extra,
                "one_off_vs_ref_s": extra - ref_extra if not isnan(ref_extra) else math.nan,
                "peak_rss_mb": r["peak_rss_mb"],
                "rss_ratio": _div(r["peak_rss_mb"], ref_rss),
            }
        )
    cols = ["experiment", "compiled", "reference", "setup_s", "first_step_s", "step_median_s"]
    return pd.DataFrame(
        rows, columns=[*cols, "one_off_s", "one_off_vs_ref_s", "peak_rss_mb", "rss_ratio"]
    )


def _div(a: Any, b: Any) -> float:
    if isnan(a) or isnan(b) or float(b) <= 0:
        return math.nan
    return float(a) / float(b)


NO_REFERENCE = "none: no fp32 eager run of this workload"


def plot_startup(start: pd.DataFrame, path: Path) -> str:
    title = "Start-up: the first step's one-off cost (compilation) and peak memory"
    data = start[start["one_off_s"].notna() | start["rss_ratio"].notna()]
    if data.empty:
        return not_run_svg(title, path, "no first-step times")
    n = len(data)
    with plt.rc_context(STYLE):
        fig, (ax, ax2) = plt.subplots(
            1, 2, figsize=(WIDE, max(2.8, 0.34 * n + 1.6)), sharey=True, constrained_layout=True
        )
        y = list(range(n))
        colors = ["#d95f02" if c else "#1f77b4" for c in data["compiled"]]
        one_off = data["one_off_s"].astype("float64").clip(lower=0)
        ax.barh(y, one_off.fillna(0), color=colors, height=0.6, zorder=2)
        top = nanmax(*one_off, 1e-9)
        for yy, v in zip(y, one_off):
            if not isnan(v):
                ax.text(v + 0.01 * top, yy, f"{v:.2f} s", va="center", fontsize=10)
        ax.set_yticks(y, list(data["experiment"]))
        ax.invert_yaxis()
        ax.set_xlim(0, top * 1.25)
        ax.set_xlabel("first step − median step (s): compile and warm-up cost")
        ax.set_title("One-off cost of the first step", fontsize=11)
        ratio = data["rss_ratio"].astype("float64")
        ax2.barh(y, ratio.fillna(0), color=colors, height=0.6, zorder=2)
        rtop = nanmax(*ratio, 1.0)
        if ratio.isna().all():
            ax2.text(0.5, 0.5, "no fp32 eager run of the same workload:\nno memory ratio",
                     transform=ax2.transAxes, ha="center", va="center", fontsize=10,
                     color="#777777")  # fmt: skip
        for yy, v in zip(y, ratio):
            if not isnan(v):
                ax2.text(v + 0.01 * rtop, yy, f"{v:.2f}×", va="center", fontsize=10)
        ax2.axvline(1.0, color="#555555", ls="--", lw=1)
        ax2.set_xlim(0, rtop * 1.2)
        ax2.set_xlabel("peak RSS ÷ the fp32 eager reference's")
        ax2.set_title("Peak memory against the reference", fontsize=11)
        handles = [
            plt.Rectangle((0, 0), 1, 1, color="#d95f02", label="torch.compile"),
            plt.Rectangle((0, 0), 1, 1, color="#1f77b4", label="not compiled"),
        ]
        # below the plots, where no bar's label runs into it
        fig.legend(handles=handles, fontsize=9, loc="outside lower center", ncol=2)
        for a in (ax, ax2):
            a.grid(axis="y", visible=False)
        return save_svg(fig, path)


def startup_section(
    stats: pd.DataFrame, baseline: str | None, plots_dir: Path
) -> tuple[str, str, str]:
    start = startup_frame(stats, baseline)
    note = (
        '<p class="note">The first step includes what runs once: torch.compile\'s '
        "tracing and code generation (an experiment's first trial compiles into a fresh, "
        "empty cache, unless <code>warm_compile_cache</code> is set; its later trials start "
        "from that cache, so the first step here is the cold trials'), allocations and "
        "cache warm-up. Its "
        "one-off cost is the first step minus a median step; setup is the time to build "
        "model, optimizer and data before it. Memory is the trial's peak RSS (all ranks "
        "together) as a ratio to the fp32 eager run of the same workload.</p>"
    )
    if start.empty:
        return ("startup", "Compile latency and memory", note + '<p class="empty">No timings.</p>')
    svg = plot_startup(start, Path(plots_dir) / "startup.svg")
    display = pd.DataFrame(
        {
            "experiment": start["experiment"],
            "compiled": start["compiled"].map(fmt_text),
            "setup (s)": [fmt_num(v, 2) for v in start["setup_s"]],
            "first step (s)": [fmt_num(v, 2) for v in start["first_step_s"]],
            "median step (s)": [fmt_num(v, 3) for v in start["step_median_s"]],
            "one-off cost (s)": [fmt_num(v, 2) for v in start["one_off_s"]],
            "reference": [fmt_text(r) if r else NO_REFERENCE for r in start["reference"]],
            "one-off over the reference's (s)": [fmt_num(v, 2) for v in start["one_off_vs_ref_s"]],
            "peak RSS (MB)": [fmt_num(v, 0) for v in start["peak_rss_mb"]],
            "memory vs reference": ["" if isnan(v) else f"{v:.2f}×" for v in start["rss_ratio"]],
        }
    )
    body = (
        note
        + table_html(display)
        + f'<figure id="fig-startup">{inline_svg(svg, "startup")}</figure>'
    )
    return ("startup", "Compile latency and memory", body)
