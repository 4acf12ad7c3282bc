"""The study's own cost: each trial's wall time against the estimate made before it ran
(``workflow_scripts.plan.estimate``), the share of it the noise probes and reruns took,
and where the trials' time went, part by part (:func:`time_parts`)."""

from __future__ import annotations

import html
from collections.abc import Iterable, Mapping

import pandas as pd

from ..util import finite, first_step_one_off, measuring_seconds, probe_seconds, timed_seconds
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


#: the parts of a trial's wall time, in the order they happen, with what each is
PARTS = (
    ("noise reruns", "attempts discarded as disturbed, and the pauses after them"),
    ("process start and exit", "the interpreter, the container, the launcher, exiting"),
    ("import torch", "in the measured process"),
    ("FLOP count", "one step of one sample on fake tensors (trial 0, with its model library's "
                   "import; later trials carry it)"),
    ("import the libraries", "the backend's (IPEX, torch_xla) and the model's (torchvision, "
                             "transformers) in the measured process"),
    ("setup", "the model, the data, the backend's preparation"),
    ("compile-pool wait", "IPEX's import starts Inductor's workers: waited out"),
    ("noise probes", "dense matmuls before and after the steps"),
    ("gradient check", "eager references of the first step (trial 0, or read where another "
                       "experiment made the same; later trials carry it)"),
    ("first step's one-off costs", "its time beyond a steady step's: allocation, compilation"),
    ("warm-up steps", "untimed, to a steady state (the first at a steady step's time)"),
    ("timed steps", "what the results are computed from"),
    ("scoring", "held-out accuracy during an epochs run"),
    ("the rest of the harness", "what the parts above leave of the harness's time"),
    ("the trial policy", "around the process: the record, the compile cache"),
)  # fmt: skip


def _n(value) -> float:
    return float(value) if finite(value) and value > 0 else 0.0


def time_parts(record: Mapping) -> dict[str, float] | None:
    """Where one trial's wall time (``trial_wall_s``) went, part by part (:data:`PARTS`);
    None for a record without its wall time."""
    wall = record.get("trial_wall_s")
    if not finite(wall) or wall <= 0:
        return None
    m = record.get("metrics") if isinstance(record.get("metrics"), Mapping) else {}
    unchecked = record.get("unchecked_metrics")  # (an incorrect run's own figures)
    m = {**(unchecked if isinstance(unchecked, Mapping) else {}), **m}
    prov = record.get("provenance") if isinstance(record.get("provenance"), Mapping) else {}
    retry = _n(record.get("retry_wall_s"))
    process = _n(prov.get("process_wall_s"))
    harness = min(_n(m.get("wall_s")), process) if process else _n(m.get("wall_s"))
    probes = sum(_n(probe_seconds(p)) for p in (record.get("probe"), record.get("probe_after")))
    measuring = measuring_seconds(m) or 0.0
    timed = timed_seconds(m) or 0.0
    inside = {
        "import torch": _n(m.get("import_s")),
        "FLOP count": _n(m.get("flops_count_s")),
        # (older records: their imports inside the setup)
        "import the libraries": min(_n(m.get("libraries_s")), _n(m.get("setup_s"))),
        "setup": max(0.0, _n(m.get("setup_s")) - _n(m.get("libraries_s"))),
        "compile-pool wait": _n(m.get("compile_pool_wait_s")),
        "noise probes": probes,
        "gradient check": _n(m.get("grad_check_s")),
        "first step's one-off costs": first_step_one_off(m) if measuring else 0.0,
        "warm-up steps": measuring - timed,
        "timed steps": timed,
        "scoring": _n(m.get("scoring_s")),
    }
    parts = {"noise reruns": retry, "process start and exit": max(0.0, process - harness)}
    parts.update(inside)
    parts["the rest of the harness"] = max(0.0, harness - sum(inside.values()))
    parts["the trial policy"] = max(0.0, wall - retry - (process or harness))
    return parts


def time_parts_frame(records: Iterable[Mapping]) -> pd.DataFrame:
    """Each part's seconds summed over the trials, and its share of their wall time."""
    sums = dict.fromkeys((name for name, _ in PARTS), 0.0)
    wall = 0.0
    for record in records:
        parts = time_parts(record) if isinstance(record, Mapping) else None
        if parts is None:
            continue
        wall += float(record["trial_wall_s"])
        for name, seconds in parts.items():
            sums[name] += seconds
    rows = [
        {"part": name, "what": what, "seconds": sums[name],
         "share": sums[name] / wall if wall > 0 else float("nan")}
        for name, what in PARTS
    ]  # fmt: skip
    return pd.DataFrame(rows)


def timing_frame(frame: pd.DataFrame) -> pd.DataFrame:
    """Per experiment: trials with both figures, the median estimate and wall time, and
    the sums (every trial, whatever its status: a failed trial also cost time)."""
    sub = frame.assign(
        _est=_num(frame, "estimate_s"),
        _wall=_num(frame, "trial_wall_s"),
        _probe=_num(frame, "probe_s"),
        _retry=_num(frame, "retry_wall_s"),
        _measuring=_num(frame, "measuring_s"),
        _timed=_num(frame, "timed_s"),
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
                "timed_sum_s": part["_timed"].fillna(0).sum(),
            }
        )
    return pd.DataFrame(rows)


def parts_html(records: Iterable[Mapping]) -> str:
    """The table of where the trials' time went (empty without records that say)."""
    parts = time_parts_frame(records)
    if not len(parts) or not (parts["seconds"] > 0).any():
        return ""
    rows = [
        {"part": r["part"], "what it is": r["what"], "time": _minutes(r["seconds"]),
         "share of the trials' wall time": f"{100 * r['share']:.1f}%"}
        for _, r in parts.iterrows()
    ]  # fmt: skip
    return "<h3>Where the trials' time went</h3>" + table_html(pd.DataFrame(rows))


def timing_section(frame: pd.DataFrame, records: Iterable[Mapping] = ()) -> Section:
    """How long the trials took against what the study predicted before they ran, and
    where that time went (``records``)."""
    table = timing_frame(frame)
    intro = (
        "<p>Before anything runs, the study predicts its wall time on this machine (printed "
        "by <code>snakemake -n</code> and at the start of every run): each trial from its "
        "FLOPs per sample, batch, steps, time budget and timeout, over the calibrated fp32 "
        "matmul ceiling (or a quick measurement before a calibration exists), scaled by the "
        "bf16/fp32 ratio the calibration measured on a small training step of the model's "
        "kind (a convolution net for the vision models, a transformer's MLP block for the "
        "text models), plus the cost of starting a process there, the harness's setup, the "
        "FLOP count (one step of one sample on fake tensors), the noise probes and a compile. "
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
    measuring, timed = table["measuring_sum_s"].sum(), table["timed_sum_s"].sum()
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
        f"{100 * retries / wall:.1f}%. Measuring (the warm-up and timed steps; the first "
        f"step as long as a steady one, its one-off costs such as compilation apart) took "
        f"<b>{_minutes(measuring)}</b>: a measurement efficiency of "
        f"<b>{100 * measuring / wall:.0f}%</b> of the trials' wall time, the timed steps "
        f"alone {100 * timed / wall:.0f}%.</p>"
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
        intro + counts + table_html(pd.DataFrame(rows)) + parts_html(records),
    )
