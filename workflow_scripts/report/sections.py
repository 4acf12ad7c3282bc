"""The report's sections: each builder returns an (id, heading, HTML content) triple
for :func:`workflow_scripts.report.html.page_html`; plus the run's provenance."""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from workflow_scripts.records import OK, error_parts, noise_group_keys

from .formatting import (
    _n_used,
    _trials,
    fmt_cv,
    fmt_int,
    fmt_num,
    fmt_speedup,
    fmt_spread,
    fmt_text,
)
from .html import (
    _figure,
    _group_note,
    _table,
    baseline_label,
    generic_display,
    ladder_display,
    roofline_display,
)
from .stats import SWEEPS, _isnan

Section = tuple[str, str, str]  # (id, heading, HTML content)
COVERED_GROUPS = {"ladder", *SWEEPS}


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
        f"environment, probe size, thread count and node type): something else was using the CPU. "
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
                "environment / probe size / threads / node type": key,
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


def ladder_section(ladder: pd.DataFrame, baseline: str | None, base: float, svg: str) -> Section:
    base_note = f"Baseline: <b>{html.escape(str(baseline_label(baseline)))}</b>"
    if not _isnan(base):
        base_note += f" at {html.escape(fmt_num(base))} samples/s."
    else:
        base_note += " (no ok trials, so no speedups)."
    return (
        "ladder",
        "Optimization ladder",
        f"<p>{base_note}</p>" + _table(ladder_display(ladder)) + _figure("ladder", svg),
    )


def sweep_sections(
    stats_sp: pd.DataFrame, baseline: str | None, svgs: Mapping[str, str]
) -> list[Section]:
    """One section per sweep of :data:`SWEEPS`, its rows in order of the swept setting."""
    sections = []
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
    return sections


def backends_section(backends: pd.DataFrame, svg: str) -> Section:
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
    return (
        "backends",
        "Backend head-to-head",
        _table(pd.DataFrame(bk_rows)) + _figure("backends", svg),
    )


def roofline_section(roof: pd.DataFrame, svg: str) -> Section:
    roof_note = (
        '<p class="note">FLOPs per sample: one forward + backward pass of the model at '
        "batch size 1, counted by torch.utils.flop_counter (2 FLOPs per multiply-add of "
        "the convolutions and matrix products; normalization and activations are not "
        "counted). Achieved GFLOP/s = FLOPs per sample × samples/s; its share of the "
        "noise probe's dense matmul rate (same process, same threads, same dtype) says "
        "how far the training step is from what the matrix units deliver here.</p>"
    )
    return (
        "roofline",
        "Roofline",
        roof_note
        + (_table(roofline_display(roof)) if len(roof) else "")
        + _figure("roofline", svg),
    )


def noise_section(frame: pd.DataFrame, records: Sequence[Mapping], threshold: float) -> Section:
    return ("noise", "Measurement noise", noise_html(frame, records, threshold))


def cost_section(costs: pd.DataFrame, baseline: str | None) -> Section:
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
    return ("cost", "Cost", cost_body)


def other_section(stats_sp: pd.DataFrame, baseline: str | None) -> Section:
    """The groups not in :data:`COVERED_GROUPS`, one table each."""
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
    return ("other", "Other groups", "\n".join(other) or '<p class="empty">No other groups.</p>')


def failures_section(frame: pd.DataFrame, records: Sequence[Mapping]) -> Section:
    return ("failures", "Failures", failures_html(frame, records))


def summary_section(frame: pd.DataFrame) -> Section:
    """Every trial's row of ``summary.csv``."""
    full = frame.to_html(
        index=False,
        escape=True,
        na_rep="",
        classes=["data"],
        border=0,
        float_format=lambda v: f"{v:.4g}",
    )
    return ("summary", "Full summary", f'<div class="scroll">{full}</div>')
