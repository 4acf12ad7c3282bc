"""The study's own cost: each trial's wall time against the estimate made before it ran
(``workflow_scripts.plan.estimate``), and the share of it the noise probes took."""

from __future__ import annotations

import html

import pandas as pd

from .formatting import fmt_int, fmt_num
from .html import table_html
from .values import isnan

Section = tuple[str, str, str]


def _num(frame: pd.DataFrame, column: str) -> pd.Series:
    if column not in frame:
        return pd.Series([float("nan")] * len(frame), index=frame.index)
    return pd.to_numeric(frame[column], errors="coerce")


def _minutes(seconds: float) -> str:
    if isnan(seconds):
        return "n/a"
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


def _off(measured: float, estimated: float) -> str:
    if isnan(measured) or isnan(estimated) or estimated <= 0:
        return ""
    return f"{measured / estimated:.2f}×"


def timing_frame(frame: pd.DataFrame) -> pd.DataFrame:
    """Per experiment: trials with both figures, the median estimate and wall time, and
    the sums (every trial, whatever its status: a failed trial also cost time)."""
    sub = frame.assign(
        _est=_num(frame, "estimate_s"),
        _wall=_num(frame, "trial_wall_s"),
        _probe=_num(frame, "probe_s"),
        _retry=_num(frame, "retry_wall_s"),
        _measuring=_num(frame, "measuring_s"),
        _attempts=_num(frame, "attempts"),
    )
    sub = sub[sub["_est"].notna() & sub["_wall"].notna()]
    rows = []
    for experiment, part in sub.groupby("experiment", sort=False):
        rows.append(
            {
                "experiment": experiment,
                "trials": len(part),
                "attempts": part["_attempts"].sum(min_count=1),
                "estimate_s": part["_est"].median(),
                "wall_s": part["_wall"].median(),
                "estimate_sum_s": part["_est"].sum(),
                "wall_sum_s": part["_wall"].sum(),
                "probe_sum_s": part["_probe"].fillna(0).sum(),
                "retry_sum_s": part["_retry"].fillna(0).sum(),
                "measuring_sum_s": part["_measuring"].fillna(0).sum(),
            }
        )
    return pd.DataFrame(rows)


def timing_section(frame: pd.DataFrame) -> Section:
    """How long the trials took against what the study predicted before they ran."""
    table = timing_frame(frame)
    intro = (
        "<p>Before anything runs, the study predicts its wall time on this machine (printed "
        "by <code>snakemake -n</code> and at the start of every run): each trial from its "
        "FLOPs per sample, batch, steps, time budget and timeout, over the calibrated fp32 "
        "matmul ceiling (or a quick measurement before a calibration exists), scaled by the "
        "bf16/fp32 ratio the calibration measured on a small training step of the model's "
        "kind (a convolution net for the vision models, a transformer's MLP block for the "
        "text models), plus the cost of starting a process there, the harness's setup, the "
        "FLOP count (one eager fp32 step of one sample), the noise probes and a compile. "
        "Each record keeps its trial's estimate beside its real wall time "
        "(every attempt); a ratio above 1 means the trial took longer than predicted. "
        "Noisy reruns are not predicted (each record's <code>retry_wall_s</code> says what "
        "they cost).</p>"
    )
    if not len(table):
        return (
            "study-time",
            "The study's own cost: time estimate vs measured",
            intro + '<p class="empty">n/a: no record holds both an estimate and its wall '
            "time (records made before the estimate existed).</p>",
        )
    est, wall = table["estimate_sum_s"].sum(), table["wall_sum_s"].sum()
    probes, retries = table["probe_sum_s"].sum(), table["retry_sum_s"].sum()
    measuring = table["measuring_sum_s"].sum()
    worst = table.assign(r=table["wall_s"] / table["estimate_s"])
    over, under = worst.loc[worst["r"].idxmax()], worst.loc[worst["r"].idxmin()]
    counts = (
        f'<p class="counts">All <b>{int(table["trials"].sum())}</b> trials with an estimate: '
        f"<b>{_minutes(wall)}</b> measured against <b>{_minutes(est)}</b> estimated "
        f"(<b>{_off(wall, est)}</b>). Furthest off: <b>{html.escape(str(over['experiment']))}"
        f"</b> took {_off(over['wall_s'], over['estimate_s'])} its estimate, "
        f"<b>{html.escape(str(under['experiment']))}</b> "
        f"{_off(under['wall_s'], under['estimate_s'])}. "
        f"The noise probes (before and after the steps) took <b>{_minutes(probes)}</b>, "
        f"{100 * probes / wall:.1f}% of the trials' wall time; the noise reruns (attempts "
        f"discarded as disturbed, and the pauses after them) <b>{_minutes(retries)}</b>, "
        f"{100 * retries / wall:.1f}%. Measuring (the step loops after their first step: "
        f"warm-up and timed steps) took <b>{_minutes(measuring)}</b>: a measurement "
        f"efficiency of <b>{100 * measuring / wall:.0f}%</b> of the trials' wall time.</p>"
        if wall > 0
        else ""
    )
    rows = [
        {
            "experiment": r["experiment"],
            "trials": fmt_int(r["trials"]),
            "attempts (noisy reruns too)": fmt_int(r["attempts"]),
            "estimated (s, median)": fmt_num(r["estimate_s"]),
            "measured (s, median)": fmt_num(r["wall_s"]),
            "measured / estimated": _off(r["wall_s"], r["estimate_s"]),
            "probes (% of wall)": fmt_num(100 * r["probe_sum_s"] / r["wall_sum_s"], 1)
            if r["wall_sum_s"] > 0
            else "",
        }
        for _, r in table.iterrows()
    ]
    return (
        "study-time",
        "The study's own cost: time estimate vs measured",
        intro + counts + table_html(pd.DataFrame(rows)),
    )
