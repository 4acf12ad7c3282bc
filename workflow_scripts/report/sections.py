"""The report's sections: each builder returns an (id, heading, HTML content) triple
for :func:`workflow_scripts.report.html.page_html`; plus the run's provenance."""

from __future__ import annotations

import hashlib
import html
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from workflow_scripts.plan.clock import LEFT_OUT
from workflow_scripts.summary.records import OK, VERSION_KEYS, error_parts, noise_group_keys

from .compare import WORKLOAD_KEYS, differences, geomean, same_workload
from .formatting import (
    fmt_cv,
    fmt_int,
    fmt_num,
    fmt_speedup,
    fmt_spread,
    fmt_text,
    fmt_usd,
)
from .html import (
    baseline_label,
    caption,
    ceiling_display,
    figure_html,
    generic_display,
    group_note,
    ladder_display,
    table_html,
)
from .machines import cpu_description, isa_verdict
from .stats import SWEEPS, left_out
from .uncertainty import Comparison, compared_cell, compared_text
from .values import isnan

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
        if isnan(rev):
            continue
        text = str(rev) + (" (dirty)" if dirty is True else "")
        if text not in revisions:
            revisions.append(text)
    started = sorted(_uniq(frame["started_at"]))
    local = set(_uniq(frame["runtime"])) <= {"local"}
    na_local = "n/a (local run)" if local else "n/a"
    slurm = ", ".join(_uniq(frame["slurm_job_id"])) if "slurm_job_id" in frame else ""
    items = [
        ("CPU", cpu_description(frame, records) if len(frame) else "n/a"),
        ("ISA", "; ".join(isa_verdict(set(flags))) if flags else "n/a (not recorded)"),
        ("ISA flags (DL-relevant)", " ".join(flags) or "n/a (not recorded)"),
        ("CPU affinity", ", ".join(_uniq(frame["affinity"])) or "n/a"),
        ("hosts", ", ".join(_uniq(frame["hostname"])) or "n/a"),
        ("kernel", ", ".join(kernels) or "n/a"),
        ("runtime", ", ".join(_uniq(frame["runtime"])) or "n/a"),
        ("SLURM jobs", slurm or "n/a (not a SLURM run)"),
        ("git revision", ", ".join(revisions) or "n/a"),
        ("preset", ", ".join(_uniq(frame["preset"])) or "n/a"),
        ("started", " … ".join(dict.fromkeys(started[:1] + started[-1:])) or "n/a"),
    ]
    kv = pd.DataFrame(items, columns=["item", "value"])
    body = kv.to_html(index=False, header=False, escape=True, classes=["data", "kv"], border=0)

    version_rows = []
    warnings: list[str] = []
    envs = frame["env"].fillna("(unknown)")
    where = frame["image"].fillna("")  # container image, if any (eager/inductor share an env)
    for (env, image), sub in frame.groupby([envs, where], sort=False):
        row = {"env": env + (f" (image {image})" if image else "")}
        in_image = bool(image) or not (set(_uniq(sub["runtime"])) <= {"local"})
        for col, label in (
            *((f"{key}_version", key) for key in VERSION_KEYS),
            ("openmp_runtime", "OpenMP runtime"),
            ("image_id", "image ID"),
            ("image_digest", "image digest"),
        ):
            value = ", ".join(_uniq(sub[col])) if col in sub else ""
            if not value:
                value = na_local if col.startswith("image") and not in_image else "n/a"
            row[label] = value
        row["lock sha256"] = ", ".join(s[:12] for s in _uniq(sub["env_lock_sha256"])) or "n/a"
        if any(v != "n/a" for k, v in row.items() if k != "env"):
            version_rows.append(row)
        warnings += env_warnings(env, sub)
    versions = pd.DataFrame(version_rows)
    flagged = "".join(f'<p class="note warn">{html.escape(w)}</p>' for w in warnings)
    return body + "<h3>Versions per environment</h3>" + table_html(versions) + flagged


_CUDA_WHEEL = re.compile(r"^(nvidia-[a-z0-9-]+|cuda-[a-z0-9-]+)==", re.MULTILINE)
REPO = Path(__file__).resolve().parents[2]


def env_warnings(env: str, sub: pd.DataFrame) -> list[str]:
    """What is odd about an environment for a CPU study: a library that reports more
    than one version across its trials (two builds installed, or a rebuilt environment
    between trials), and CUDA builds or CUDA wheels (a CUDA build of torch, the
    ``nvidia-*``/``cuda-*`` wheels its lock pins, when the lock in this checkout is the
    one the trials ran with)."""
    out = []
    for col, name in (("torch_version", "torch"), ("torchvision_version", "torchvision")):
        values = _uniq(sub[col]) if col in sub else []
        if len(values) > 1:
            out.append(
                f"Environment {env}: its trials report {len(values)} builds of {name} "
                f"({', '.join(values)}): rebuilt between trials, or two builds installed."
            )
    torch = " ".join(_uniq(sub["torch_version"])) if "torch_version" in sub else ""
    cuda = re.findall(r"\+(cu\d+)", torch)
    wheels = _locked_cuda_wheels(env, _uniq(sub["env_lock_sha256"]), _uniq(sub["python_version"]))
    if cuda or wheels:
        what = []
        if cuda:
            what.append(f"torch is a CUDA build ({', '.join(dict.fromkeys(cuda))})")
        if wheels:
            what.append(
                f"its lock envs/{env}.txt pins {len(wheels)} CUDA wheels "
                f"({', '.join(wheels[:4])}{', …' if len(wheels) > 4 else ''})"
            )
        out.append(
            f"Environment {env}: {'; '.join(what)}. A CPU study does not use them: they cost "
            "download, disk and import time, and a CPU-only wheel "
            "(download.pytorch.org/whl/cpu) would avoid them."
        )
    return out


def _locked_cuda_wheels(env: str, shas: list[str], pythons: list[str]) -> list[str]:
    path = REPO / "envs" / f"{env}.txt"
    try:
        data = path.read_bytes()
    except OSError:
        return []
    for py in pythons:
        short = ".".join(py.split(".")[:2])
        digest = hashlib.sha256(data + f"\npython={short}\n".encode()).hexdigest()
        if digest in shas:
            return [m.rstrip("=") for m in _CUDA_WHEEL.findall(data.decode("utf-8", "replace"))]
    return []


def failures_html(frame: pd.DataFrame, records: Sequence[Mapping]) -> str:
    blocks = []
    n_left = left_out(frame)
    if n_left:
        one = n_left == 1
        they, them = ("it", "it") if one else ("they", "them")
        blocks.append(
            f'<p class="note" id="left-out">{n_left} trial{"" if one else "s"} left out, '
            f"not failed: the budget's clock ran out before {they} started "
            f"({'its record says' if one else 'each record says'} when); the next "
            f"<code>snakemake</code> runs {them}, and no other trial.</p>"
        )
    for i, row in frame.iterrows():
        if row["status"] in (OK, LEFT_OUT):
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
    if isnan(a) or isnan(b) or not float(b):
        return ""
    return f"{float(a) / float(b):.2f}"


def noise_html(frame: pd.DataFrame, records: Sequence[Mapping], threshold: float) -> str:
    """Which trials were noisy or rerun, and why: their probe against the median (the
    rule itself is explained once, in ``captions/noise.html``)."""
    ok = frame["status"] == OK
    probed = ok & pd.to_numeric(frame["probe_fp32_gflops"], errors="coerce").notna()
    noisy = frame[frame["noisy"].fillna(False).astype(bool)]
    if "noise_signal" not in noisy:
        noisy = noisy.assign(noise_signal=None)
    discarded = _discarded_attempts(frame, records)
    intro = caption(
        "noise.html",
        threshold=f"{threshold:g}",
        noisy=len(noisy),
        probed=int(probed.sum()),
        discarded=len(discarded),
        attempts="attempt" if len(discarded) == 1 else "attempts",
        unprobed=int((ok & ~probed).sum()),
    )
    rows = [_noisy_row(r) for _, r in noisy.iterrows()]
    groups = _probe_groups(frame[probed])
    return (
        intro
        + "<h3>Noisy trials (probe rates in GFLOP/s)</h3>"
        + (table_html(pd.DataFrame(rows)) if rows else '<p class="empty">No noisy trials.</p>')
        + "<h3>Attempts discarded by the trial policy (noise reruns)</h3>"
        + (
            table_html(pd.DataFrame(discarded))
            if discarded
            else '<p class="empty">No attempts discarded.</p>'
        )
        + "<h3>Probe medians per comparison group</h3>"
        + (table_html(pd.DataFrame(groups)) if groups else '<p class="empty">No probes.</p>')
    )


def _discarded_attempts(frame: pd.DataFrame, records: Sequence[Mapping]) -> list[dict]:
    """A row per attempt the trial policy discarded (and ran again) as noisy."""
    rows = []
    for i, record in enumerate(records):
        attempts = record.get("discarded_attempts") if isinstance(record, Mapping) else None
        for a in attempts if isinstance(attempts, list) else []:
            a = a if isinstance(a, Mapping) else {}
            p = a.get("probe") if isinstance(a.get("probe"), Mapping) else {}
            rows.append(
                {
                    "experiment": fmt_text(frame["experiment"].iloc[i]),
                    "trial": fmt_int(frame["trial"].iloc[i]),
                    "attempt": fmt_int(a.get("attempt")),
                    "probe fp32 (GFLOP/s)": fmt_num(p.get("fp32_gflops")),
                    "probe bf16 (GFLOP/s)": fmt_num(p.get("bf16_gflops")),
                    "samples/s": fmt_num(a.get("samples_per_s")),
                    "caught by": fmt_text(a.get("signal")) or "probe before steps",
                    "reason": fmt_text(a.get("reason")),
                }
            )
    return rows


def _noisy_row(r) -> dict:
    """A noisy trial: what caught it, its probes against their medians."""
    return {
        "experiment": r["experiment"],
        "trial": fmt_int(r["trial"]),
        "caught by": fmt_text(r.get("noise_signal")) or "peer probes",
        "samples/s": fmt_num(r["samples_per_s"]),
        "step-time CV": fmt_cv(r.get("step_time_cv")) or "n/a",
        "probe fp32": fmt_num(r["probe_fp32_gflops"]),
        "median fp32": fmt_num(r["probe_fp32_median_gflops"]),
        "fp32 ratio": _ratio(r["probe_fp32_gflops"], r["probe_fp32_median_gflops"]),
        "probe bf16": fmt_num(r["probe_bf16_gflops"]),
        "median bf16": fmt_num(r["probe_bf16_median_gflops"]),
        "bf16 ratio": _ratio(r["probe_bf16_gflops"], r["probe_bf16_median_gflops"]),
        "probe after (fp32)": fmt_num(r.get("probe_after_fp32_gflops")) or "n/a",
        "other work on its CPUs": fmt_cv(r.get("other_work_share")) or "n/a",
        "load avg 1 min": fmt_num(r["load_avg_1m"], 2),
    }


def _probe_groups(probed: pd.DataFrame) -> list[dict]:
    """The probes' medians per group of trials measured the same way."""
    groups = []
    for key, part in probed.groupby(noise_group_keys(probed), sort=False):
        groups.append(
            {
                "environment / probe size / threads / node type": key,
                "ok trials": len(part),
                "noisy": int(part["noisy"].sum()),
                "median fp32 (GFLOP/s)": fmt_num(part["probe_fp32_gflops"].median()),
                "median bf16 (GFLOP/s)": fmt_num(part["probe_bf16_gflops"].median()),
            }
        )
    return groups


def ladder_section(ladder: pd.DataFrame, baseline: str | None, base: float, svg: str) -> Section:
    base_note = f"Baseline: <b>{html.escape(str(baseline_label(baseline)))}</b>"
    if not isnan(base):
        base_note += f" at {html.escape(fmt_num(base))} samples/s."
    else:
        base_note += " (no ok trials, so no speedups)."
    note = (
        '<p class="note">Each row is a variant of its own, divided by the baseline. The '
        "column <i>over the step it builds on</i> divides it by the earlier row it differs "
        "from least, and names what differs: that ratio is the gain of that change alone "
        "(e.g. channels_last on top of bf16), where the speedup over the baseline adds up "
        "all the changes. Step-time percentiles need enough timed steps to mean "
        "something (p90: 10, p99: 100); with fewer they read n/a.</p>"
    )
    if not len(ladder):
        return ("ladder", "Optimization ladder", '<p class="empty">No ladder experiments.</p>')
    return (
        "ladder",
        "Optimization ladder",
        f"<p>{base_note}</p>"
        + note
        + table_html(ladder_display(ladder))
        + figure_html("ladder", svg),
    )


def _like_for_like(sub: pd.DataFrame, stats: pd.DataFrame, baseline: str | None) -> pd.DataFrame:
    """``speedup_text``/``group_text`` cells: the ratio where the runs train the same
    model and image size, else "n/a" naming the difference."""
    sub = sub.copy()
    base = stats[stats["experiment"] == baseline]
    base_row = base.iloc[0] if len(base) else None
    first = {}
    for _, r in stats.iterrows():
        first.setdefault(r["group_baseline"], r)
    by_id = stats.set_index("experiment", drop=False)
    speed, group = [], []
    for _, r in sub.iterrows():
        if base_row is None:
            speed.append(fmt_speedup(r.get("speedup")))
        elif same_workload(base_row, r):
            speed.append(compared_text(base_row, r) or fmt_speedup(r.get("speedup")))
        else:
            speed.append("n/a (" + ", ".join(differences(base_row, r, WORKLOAD_KEYS)) + ")")
        head = by_id.loc[r["group_baseline"]] if r["group_baseline"] in by_id.index else None
        if isinstance(head, pd.DataFrame):
            head = head.iloc[0]
        if head is None or head["experiment"] == r["experiment"]:
            group.append(fmt_speedup(r.get("group_speedup")))
        elif not same_workload(head, r):
            group.append("n/a (" + ", ".join(differences(head, r, WORKLOAD_KEYS)) + ")")
        else:
            diff = ", ".join(differences(head, r))
            text = compared_text(head, r) or fmt_speedup(r.get("group_speedup"))
            group.append(text + (f" ({diff})" if diff else ""))
    sub["speedup_text"] = speed
    sub["group_text"] = group
    return sub


def sweep_sections(
    stats_sp: pd.DataFrame, baseline: str | None, svgs: Mapping[str, str]
) -> tuple[list[Section], list[str]]:
    """One section per sweep of :data:`SWEEPS` that this run has, its rows in order of
    the swept setting; and the names of the sweeps it does not have."""
    sections, not_run = [], []
    for group, (x, _xlabel, name) in SWEEPS.items():
        sub = stats_sp[stats_sp["group"] == group].copy()
        if not len(sub):
            not_run.append(f"{name.lower()} sweep")
            continue
        sub["_x"] = pd.to_numeric(sub[x], errors="coerce")
        sub = sub.sort_values("_x", kind="stable")
        sub = _like_for_like(sub, stats_sp, baseline)
        ok = sub["sps_median"].notna().any()
        sections.append(
            (
                group,
                f"Sweep: {name}",
                group_note(sub, baseline)
                + table_html(generic_display(sub))
                + (
                    figure_html(group, svgs[group])
                    if ok
                    else '<p class="empty">No successful trials in this sweep (see Failures).</p>'
                ),
            )
        )
    return sections, not_run


def backends_section(
    matrix: pd.DataFrame, order: Sequence[str], compiled: pd.DataFrame, svg: str
) -> Section:
    note = (
        '<p class="note">Backends compared like for like: each row is one configuration '
        "(model, image size, batch, data, precision, memory format, launcher, ranks, "
        "threads) that two backend variants or more ran; each cell is that variant's median "
        "samples/s at exactly that configuration, with its ratio to eager there. The torch "
        "version each ran is in the column header. A backend missing from a row did not run "
        "that configuration.</p>"
    )
    if not len(matrix):
        return (
            "backends",
            "Backend head-to-head",
            note + '<p class="empty">No configuration was run by two backends.</p>',
        )
    torch = {}
    for _, r in matrix.iterrows():
        v = fmt_text(r["torch_version"])
        if v:
            torch.setdefault(r["variant"], v.split("+")[0])
    heads = {v: f"{v} (torch {torch[v]})" if v in torch else v for v in order}
    rows = []
    for config, part in matrix.groupby("config", sort=False):
        row = {"configuration": config}
        cells = part.set_index("variant")
        for v in order:
            if v not in cells.index:
                row[heads[v]] = "not run"
                continue
            c = cells.loc[v]
            sps = fmt_spread(c["sps_median"], c["sps_min"], c["sps_max"], int(c["n_used"] or 0))
            text = f"{sps or 'no ok trial'} ({c['experiment']})"
            if v != "eager" and not isnan(c["vs_eager"]):
                compared = c.get("compared")
                if isinstance(compared, Comparison) and not isnan(compared.ratio):
                    text += f", {compared.ratio:.2f}× eager ({compared.qualifier()})"
                else:
                    text += f", {c['vs_eager']:.2f}× eager"
            row[heads[v]] = text
        rows.append(row)
    body = note + table_html(pd.DataFrame(rows))
    if len(compiled):
        g = geomean(compiled["speedup"])
        pairs = "; ".join(
            f"{r['experiment']} {_pair_text(r)} over {r['eager']}" for _, r in compiled.iterrows()
        )
        body += (
            f'<p class="counts">torch.compile over its eager twin: geometric mean '
            f"<b>{fmt_speedup(g) or 'n/a'}</b> ({html.escape(pairs)}).</p>"
        )
    return ("backends", "Backend head-to-head", body + figure_html("backends", svg))


def _pair_text(r: Mapping) -> str:
    return compared_cell(r, "compared", "speedup") or "n/a"


def ceiling_section(roof: pd.DataFrame, svg: str) -> Section:
    roof_note = (
        '<p class="note">FLOPs per sample: one forward + backward pass of the model at '
        "batch size 1 (a served model: one forward pass), counted by "
        "torch.utils.flop_counter (2 FLOPs per multiply-add of the convolutions and "
        "matrix products; normalization and activations are not counted). Achieved "
        "GFLOP/s = FLOPs per sample × samples/s, as a percentage of the best dense rate "
        "(a matmul or a 3x3 convolution) that any of the study's calibrations measured "
        "on this machine with the same threads and dtype (the calibrated ceiling; older "
        "records: the trial's own noise probe). There is "
        "no arithmetic-intensity axis, so this is not a roofline: it says how far the "
        "training step is from what the matrix units deliver here. A share above 100% is "
        "a measurement error and is shown as such.</p>"
    )
    return (
        "ceiling",
        "% of the measured ceiling (matmul or convolution)",
        roof_note
        + (
            table_html(ceiling_display(roof))
            if len(roof)
            else '<p class="empty">No FLOP counts.</p>'
        )
        + (figure_html("ceiling", svg) if roof["pct_of_peak"].notna().any() else ""),
    )


def noise_section(frame: pd.DataFrame, records: Sequence[Mapping], threshold: float) -> Section:
    return ("noise", "Measurement noise", noise_html(frame, records, threshold))


def cost_section(costs: pd.DataFrame, baseline: str | None) -> Section:
    cost_note = (
        '<p class="note">Prices come from the workflow configuration (<code>prices:</code>), '
        "not from a live price list: edit them. Dollars per million samples = USD per hour "
        "/ (samples/s × 3600) × 10⁶. A price marked <i>measured</i> is the price of the "
        "machine these results were measured on; a price marked <i>article</i> is the "
        "article's instance, priced with the article's own throughput (its claims: "
        "ResNet-50, batch 128, 8 vCPUs), never with ours. To price another machine with "
        "throughput measured on it, add its results (see Machines side by side).</p>"
    )
    if not len(costs):
        return ("cost", "Cost", cost_note + '<p class="empty">No prices configured.</p>')
    rows = []
    for _, c in costs.iterrows():
        for which in ("baseline", "best"):
            rows.append(
                {
                    "instance": c["name"],
                    "USD/hour": fmt_num(c["usd_per_hour"], 4),
                    "throughput from": c["throughput"],
                    "configuration": fmt_text(c[which]) or "n/a",
                    "samples/s": fmt_num(c[f"{which}_sps"]) or "n/a",
                    "$ per million samples": fmt_usd(c[f"{which}_usd_per_million"]),
                    "million samples per $": _per_usd(c[f"{which}_samples_per_usd"]),
                    "note": c["note"],
                }
            )
    return ("cost", "Cost", cost_note + table_html(pd.DataFrame(rows)))


def _per_usd(value: Any) -> str:
    return "n/a" if isnan(value) else f"{float(value) / 1e6:.3g}"


def other_section(stats_sp: pd.DataFrame, baseline: str | None) -> Section:
    """The groups not in :data:`COVERED_GROUPS`, one table each."""
    other = []
    groups = stats_sp["group"].fillna("(none)")
    for group in dict.fromkeys(groups):
        if group in COVERED_GROUPS:
            continue
        sub = _like_for_like(stats_sp[groups == group], stats_sp, baseline)
        other.append(
            f"<h3>{html.escape(str(group))}</h3>"
            + group_note(sub, baseline)
            + table_html(generic_display(sub))
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
