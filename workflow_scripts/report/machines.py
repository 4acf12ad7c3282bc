"""Several machines in one report: the results of other runs (each a results folder,
a records folder or a ``summary.csv``, with its own name and hourly price) beside
this run's, compared only where their experiments match (the same id and the same
settings), with what each machine's ISA explains.

Also the CPU's description and ISA verdict, shared with the headline."""

from __future__ import annotations

import dataclasses
import html
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib.patches
import matplotlib.pyplot as plt
import pandas as pd

from workflow_scripts.summary.machine_results import machine_files, result_files  # noqa: F401 (API)
from workflow_scripts.summary.records import DEFAULT_NOISE_THRESHOLD, load_records, summary_frame

from ..plan.estimate import bf16_kind
from .compare import SETTING_KEYS, WORKLOAD_KEYS, differences, geomean, same_workload
from .figures import STYLE, WIDE, inline_svg, save_svg
from .formatting import fmt_num, fmt_text, fmt_usd
from .html import table_html
from .stats import (
    baseline_sps,
    enrich,
    experiment_stats,
    pick_baseline,
    usd_per_million,
)
from .uncertainty import compared_text
from .values import isnan

# What must be equal for two machines' runs of one experiment id to be compared: the
# workload and every setting, but not what is the machine's own (its torch build, its
# thread count), plus the steps measured.
MATCH_KEYS = (
    *WORKLOAD_KEYS,
    *(k for k in SETTING_KEYS if k not in ("torch_version", "threads")),
    "warmup_steps",
    "steps",
)


@dataclasses.dataclass
class Machine:
    """One result set: its name, trials (``frame``, enriched), records (empty for a
    summary.csv), hourly price and per-experiment statistics."""

    name: str
    frame: pd.DataFrame
    records: list
    usd_per_hour: float = math.nan
    note: str = ""
    source: str = ""
    stats: pd.DataFrame = dataclasses.field(default_factory=pd.DataFrame)
    baseline: str | None = None

    def __post_init__(self) -> None:
        if self.stats.empty and len(self.frame):
            self.stats = experiment_stats(self.frame)
            self.baseline = pick_baseline(self.stats)


def parse_machines(value: Any) -> list[dict]:
    """Normalise ``--machines-json``/``report.machines``: a list of {name, results,
    usd_per_hour, note}."""
    if value is None:
        return []
    if isinstance(value, str):
        value = json.loads(value) if value.strip() else []
    if isinstance(value, Mapping):
        value = [value]
    out = []
    for i, item in enumerate(value or []):
        if not isinstance(item, Mapping) or not item.get("results"):
            raise ValueError(f"machine {i + 1} needs 'results' (a results folder or summary.csv)")
        try:
            usd = float(item.get("usd_per_hour"))
        except (TypeError, ValueError):
            usd = math.nan
        out.append(
            {
                "name": str(item.get("name") or Path(str(item["results"])).name),
                "results": str(item["results"]),
                "usd_per_hour": usd,
                "note": str(item.get("note") or ""),
            }
        )
    return out


def load_machine(entry: Mapping, noise_threshold: float = DEFAULT_NOISE_THRESHOLD) -> Machine:
    files = result_files(entry["results"])
    if not files:
        raise ValueError(
            f"machine {entry['name']!r}: {entry['results']} holds no trial records "
            "(records/<experiment>/trial<k>.json) and no summary.csv"
        )
    if len(files) == 1 and files[0].suffix == ".csv":
        frame = enrich(pd.read_csv(files[0]), [])
        records: list = []
    else:
        records = load_records(files)
        frame = enrich(summary_frame(records, noise_threshold), records)
    return Machine(
        name=entry["name"],
        frame=frame,
        records=records,
        usd_per_hour=entry.get("usd_per_hour", math.nan),
        note=entry.get("note", ""),
        source=str(entry["results"]),
    )


# ------------------------------------------------------------------------------- CPU


def cpu_flags(frame: pd.DataFrame) -> set[str]:
    flags: set[str] = set()
    for v in frame["cpu_flags"].dropna() if "cpu_flags" in frame else []:
        flags.update(str(v).split())
    return flags


def isa_verdict(flags: set[str]) -> tuple[str, str]:
    """(short ISA name, what it means for bf16 training) from the recorded flags."""
    if not flags:
        return "unknown ISA", "no ISA flags recorded"
    if "amx_bf16" in flags:
        return (
            "AMX + AVX-512 BF16",
            "native bf16 matrix tiles (AMX): bf16 should run well above fp32",
        )
    if "avx512_bf16" in flags:
        return (
            "AVX-512 BF16, no AMX",
            "native bf16 dot products, no matrix tiles: bf16 can beat fp32, by less than on AMX",
        )
    if bf16_kind(flags) == "avx512":
        return (
            "AVX-512 (no BF16)",
            "bf16 is emulated in AVX-512 registers: expect bf16 slower than fp32, "
            "though by less than on AVX2",
        )
    if "avx2" in flags:
        return "AVX2 only", "bf16 is emulated and slow: expect bf16 slower than fp32"
    return "no AVX2", "no vector extensions recorded: expect slow training"


def cpu_description(frame: pd.DataFrame, records: Sequence[Any] = ()) -> str:
    """``AMD EPYC (family 25, model 17, stepping 1), 2 logical CPUs (2 cores, 1 NUMA
    node)``; family/model/stepping where the provenance has them."""
    model = ", ".join(dict.fromkeys(str(v) for v in frame["cpu_model"].dropna())) or "unknown CPU"
    ids = []
    for r in records:
        prov = r.get("provenance") if isinstance(r, Mapping) else None
        if not isinstance(prov, Mapping):
            continue
        parts = [
            f"{label} {prov[key]}"
            for key, label in (
                ("cpu_family", "family"),
                ("cpu_model_number", "model"),
                ("cpu_stepping", "stepping"),
            )
            if prov.get(key) is not None
        ]
        text = ", ".join(parts)
        if text and text not in ids:
            ids.append(text)
    model += f" ({'; '.join(ids)})" if ids else " (family/model/stepping not recorded)"
    cpus = ", ".join(dict.fromkeys(fmt_text(v) for v in frame["logical_cpus"].dropna()))
    cores = ", ".join(dict.fromkeys(fmt_text(v) for v in frame["physical_cores"].dropna()))
    numa = ", ".join(dict.fromkeys(fmt_text(v) for v in frame["numa_nodes"].dropna()))
    bits = []
    if cpus:
        bits.append(f"{cpus} logical CPUs")
    if cores:
        bits.append(f"{cores} core{'' if cores == '1' else 's'}")
    if numa:
        bits.append(f"{numa} NUMA node{'' if numa == '1' else 's'}")
    return model + (", " + ", ".join(bits) if bits else "")


def bf16_gain(stats: pd.DataFrame) -> tuple[float, int]:
    """The geometric mean of bf16 over fp32 across pairs that differ only in precision
    (and how many pairs)."""
    ratios = []
    fp32 = stats[stats["precision"].fillna("fp32") == "fp32"]
    for _, r in stats[stats["precision"] == "bf16"].iterrows():
        for _, f in fp32.iterrows():
            if same_workload(f, r) and [d.split(" ")[0] for d in differences(f, r)] == [
                "precision"
            ]:
                if not (isnan(r["sps_median"]) or isnan(f["sps_median"])):
                    ratios.append(r["sps_median"] / f["sps_median"])
                break
    return geomean(ratios), len(ratios)


# ------------------------------------------------------------------------- matching


def match(machines: Sequence[Machine]) -> tuple[list[str], list[str]]:
    """(experiment ids that every machine ran with the same settings, in the first
    machine's order; notes on what did not match: other settings, other presets, other
    environment locks)."""
    notes: list[str] = []
    if len(machines) < 2:
        return [], notes
    by_name = [m.stats.set_index("experiment") if len(m.stats) else None for m in machines]
    if any(s is None for s in by_name):
        empty = [m.name for m, s in zip(machines, by_name) if s is None]
        return [], [f"no results from {', '.join(empty)}"]
    common = [e for e in by_name[0].index if all(e in s.index for s in by_name[1:])]
    matched = []
    for exp in common:
        first = by_name[0].loc[exp]
        diffs = []
        for m, s in zip(machines[1:], by_name[1:]):
            d = [x for x in differences(first, s.loc[exp], MATCH_KEYS) if not x.startswith("torch")]
            if d:
                diffs.append(f"{m.name}: {', '.join(d)}")
        if diffs:
            notes.append(f"{exp} is left out: its settings differ ({'; '.join(diffs)})")
        else:
            matched.append(exp)
    only = sorted({e for s in by_name for e in s.index} - set(common))
    if only:
        notes.append(
            f"{len(only)} experiment{'s' if len(only) > 1 else ''} ran on some machines only "
            f"and {'are' if len(only) > 1 else 'is'} left out: {', '.join(only[:12])}"
            + (" …" if len(only) > 12 else "")
        )
    presets = {m.name: sorted({str(v) for v in m.frame["preset"].dropna()}) for m in machines}
    if len({tuple(v) for v in presets.values()}) > 1:
        notes.append(
            "the machines ran different presets ("
            + "; ".join(f"{n}: {', '.join(v) or '?'}" for n, v in presets.items())
            + "): compared only on the experiments that match"
        )
    locks: dict[str, dict[str, str]] = {}
    for m in machines:
        for env, sub in m.frame.groupby(m.frame["env"].fillna("?")):
            shas = sorted({str(v)[:12] for v in sub["env_lock_sha256"].dropna()})
            locks.setdefault(str(env), {})[m.name] = ", ".join(shas) or "?"
    for env, per in locks.items():
        if len(per) > 1 and len(set(per.values())) > 1:
            notes.append(
                f"environment {env} was built from different locks ("
                + "; ".join(f"{n}: {v}" for n, v in per.items())
                + "): library versions may differ"
            )
    return matched, notes


def comparison_frame(machines: Sequence[Machine], matched: Sequence[str]) -> pd.DataFrame:
    """Long frame: machine, experiment, samples/s, speedup over the machine's own
    baseline, dollars per million samples at the machine's price."""
    rows = []
    for m in machines:
        stats = m.stats.set_index("experiment", drop=False)
        base = baseline_sps(m.stats, m.baseline)
        ref = stats.loc[m.baseline] if m.baseline in stats.index else None
        for exp in matched:
            r = stats.loc[exp]
            sps = r["sps_median"]
            rows.append(
                {
                    "machine": m.name,
                    "experiment": exp,
                    "group": r["group"],
                    "sps": sps,
                    "speedup": sps / base if base and not isnan(base) else math.nan,
                    "usd_per_million": usd_per_million(sps, m.usd_per_hour),
                    # over its own baseline with the interval of its own run's spread
                    "compared": "" if ref is None or exp == m.baseline else compared_text(ref, r),
                }
            )
    columns = ["machine", "experiment", "group", "sps", "speedup", "usd_per_million", "compared"]
    return pd.DataFrame(rows, columns=columns)


def plot_machines(comp: pd.DataFrame, names: Sequence[str], path: Path) -> str:
    """Two panels: speedup over each machine's own baseline, and dollars per million
    samples, one bar per machine for each matched experiment."""
    exps = list(dict.fromkeys(comp["experiment"]))
    n, k = len(exps), len(names)
    has_cost = comp["usd_per_million"].notna().any()
    with plt.rc_context(STYLE):
        fig, axes = plt.subplots(
            1,
            2 if has_cost else 1,
            figsize=(WIDE, max(3.0, n * (0.3 * k + 0.35) + 1.6)),
            sharey=True,
            squeeze=False,
            constrained_layout=True,
        )
        height = 0.8 / k
        panels = [("speedup", "speedup over the machine's own baseline", "{:.2f}×")]
        if has_cost:
            panels.append(
                ("usd_per_million", "$ per million samples (lower is cheaper)", "${:,.2f}")
            )
        for ax, (col, label, fmt) in zip(axes[0], panels):
            top = comp[col].max(skipna=True)
            top = top if top and not isnan(top) else 1.0
            for mi, name in enumerate(names):
                part = comp[comp["machine"] == name].set_index("experiment")
                for ei, exp in enumerate(exps):
                    v = part.loc[exp, col] if exp in part.index else math.nan
                    yy = ei + (mi - (k - 1) / 2) * height
                    if isnan(v):
                        ax.text(0.01 * top, yy, "n/a", va="center", fontsize=9, color="#777777")
                        continue
                    ax.barh(yy, v, height=height * 0.9, color=f"C{mi % 10}", zorder=2)
                    ax.text(v + 0.01 * top, yy, fmt.format(v), va="center", fontsize=9)
            ax.set_xlim(0, top * 1.3)
            ax.set_xlabel(label)
            ax.grid(axis="y", visible=False)
            if col == "speedup":
                ax.axvline(1.0, color="#555555", ls="--", lw=1)
        axes[0][0].set_yticks(range(n), exps)
        axes[0][0].invert_yaxis()
        handles = [
            matplotlib.patches.Patch(color=f"C{i % 10}", label=nm) for i, nm in enumerate(names)
        ]
        fig.legend(handles=handles, loc="outside lower center", ncol=min(k, 4))
        fig.suptitle("Machines side by side (matching experiments only)", fontweight="bold")
        return save_svg(fig, path)


def machines_section(
    machines: Sequence[Machine], plots_dir: Path
) -> tuple[tuple[str, str, str], dict]:
    """The section, and what the headline says about it (``cheapest``: machine,
    experiment, dollars per million samples; ``fastest``...)."""
    matched, notes = match(machines)
    rows = []
    summary: dict = {"matched": len(matched)}
    for m in machines:
        flags = cpu_flags(m.frame)
        isa, meaning = isa_verdict(flags)
        gain, pairs = bf16_gain(m.stats)
        stats = m.stats[m.stats["experiment"].isin(matched)] if matched else m.stats.iloc[0:0]
        best = (
            stats.loc[stats["sps_median"].idxmax()] if stats["sps_median"].notna().any() else None
        )
        cost = math.nan if best is None else usd_per_million(best["sps_median"], m.usd_per_hour)
        if best is not None and not isnan(cost):
            have = summary.get("cheapest")
            if have is None or cost < have[2]:
                summary["cheapest"] = (m.name, best["experiment"], cost, best["sps_median"])
        observed = (
            f"bf16 ran {gain:.2f}× fp32 here (geomean of {pairs} pair{'s' if pairs > 1 else ''})"
            if pairs
            else "no bf16/fp32 pair to check"
        )
        rows.append(
            {
                "machine": m.name,
                "CPU": cpu_description(m.frame, m.records),
                "ISA": isa,
                "what the ISA explains": f"{meaning}; {observed}",
                "preset": ", ".join(sorted({str(v) for v in m.frame["preset"].dropna()})),
                "USD/hour": fmt_num(m.usd_per_hour, 3) or "n/a (no price)",
                "baseline samples/s": fmt_num(baseline_sps(m.stats, m.baseline)),
                "fastest matching experiment": "" if best is None else str(best["experiment"]),
                "its samples/s": "" if best is None else fmt_num(best["sps_median"]),
                "$ per million samples": fmt_usd(cost),
                "million samples per $": "" if isnan(cost) else f"{1 / cost:.3g}",
            }
        )
    parts = [
        '<p class="note">Each machine\'s results come from its own run, priced at its own '
        "hourly rate. Two machines' runs of an experiment are compared only when they have "
        "the same id and the same settings (model, batch, precision, layout, backend, "
        "launcher, steps); speedups are over each machine's own baseline.</p>",
        table_html(pd.DataFrame(rows)),
    ]
    for note in notes:
        parts.append(f'<p class="note warn">{html.escape(note)}.</p>')
    if matched:
        comp = comparison_frame(machines, matched)
        wide = []
        for exp in matched:
            row: dict[str, str] = {"experiment": exp}
            for m in machines:
                c = comp[(comp["machine"] == m.name) & (comp["experiment"] == exp)].iloc[0]
                row[f"{m.name}: samples/s"] = fmt_num(c["sps"])
                row[f"{m.name}: × own baseline"] = (
                    "" if isnan(c["speedup"]) else c["compared"] or f"{c['speedup']:.2f}×"
                )
                row[f"{m.name}: $/M samples"] = fmt_usd(c["usd_per_million"])
            wide.append(row)
        parts.append("<h3>Matching experiments, machine by machine</h3>")
        parts.append(table_html(pd.DataFrame(wide)))
        svg = plot_machines(comp, [m.name for m in machines], Path(plots_dir) / "machines.svg")
        parts.append(f'<figure id="fig-machines">{inline_svg(svg, "machines")}</figure>')
    else:
        parts.append('<p class="empty">No experiment matches across the machines.</p>')
    return ("machines", "Machines side by side", "\n".join(parts)), summary
