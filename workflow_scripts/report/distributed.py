"""The report's distributed section: data-parallel throughput per layout (ranks x
threads) and process-group backend beside the book's claims, and the allreduce
microbenchmark's latency and bus-bandwidth curves."""

from __future__ import annotations

import html
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import pandas as pd

from .figures import STYLE, _no_data, _save, inline_svg
from .formatting import _n_used, fmt_num, fmt_speedup, fmt_spread, fmt_text
from .html import _table

# The book chapter's claims (../shared/STUDY.md), measured on its own machine.
BOOK_CLAIMS = (
    "oneCCL over 40% faster than Gloo on one machine",
    "more ranks about 2x faster than one process, with some accuracy lost",
)


def process_group(row: Mapping) -> str:
    """``gloo``, or ``ccl shm``/``ccl tcp`` (``+ worker`` with oneCCL's worker thread)."""
    backend = str(row.get("dist_backend") or "gloo")
    if backend != "ccl":
        return backend
    text = f"ccl {row.get('ccl_transport') or 'shm'}"
    if _true(row.get("ccl_worker_offload")):
        text += " + worker"
    if str(row.get("ccl_impl") or "study") != "study":
        text += f" ({row.get('ccl_impl')})"
    return text


def _true(value: Any) -> bool:
    return value is True or str(value).lower() == "true"


def layout(row: Mapping) -> str:
    ranks = row.get("ranks")
    ranks = 1 if ranks is None or (isinstance(ranks, float) and math.isnan(ranks)) else int(ranks)
    threads = row.get("threads")
    per = (
        "all"
        if threads is None or (isinstance(threads, float) and math.isnan(threads))
        else int(threads)
    )
    return f"{ranks} × {per}"


def ddp_display(stats: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for _, r in stats.iterrows():
        rows.append(
            {
                "experiment": r["experiment"],
                "group": fmt_text(r["group"]),
                "ranks × threads": layout(r),
                "process group": process_group(r),
                "backend": fmt_text(r["backend"]),
                "precision": fmt_text(r["precision"]),
                "global batch": fmt_text(r["batch_size"]),
                "samples/s": fmt_spread(r["sps_median"], r["sps_min"], r["sps_max"], _n_used(r)),
                "step median (s)": fmt_num(r["step_time_median_s"], 3),
                "vs first in group": fmt_speedup(r.get("group_speedup")),
                "claimed": fmt_speedup(r.get("claim_speedup")),
                "peak RSS, all ranks (MB)": fmt_num(r["peak_rss_mb"], 0),
            }
        )
    return pd.DataFrame(rows)


def collectives_frame(results: Sequence[Mapping]) -> pd.DataFrame:
    """One row per variant, dtype and message size of the ok collectives results."""
    rows = []
    for res in results:
        if not isinstance(res, Mapping) or res.get("status") != "ok":
            continue
        for r in res.get("results") or []:
            rows.append(
                {
                    "variant": res.get("variant"),
                    "ranks": res.get("ranks"),
                    "dtype": r["dtype"],
                    "bytes": r["bytes"],
                    "latency_s": r["latency_s"]["median"],
                    "busbw_GBps": r["busbw_GBps"],
                }
            )
    return pd.DataFrame(
        rows, columns=["variant", "ranks", "dtype", "bytes", "latency_s", "busbw_GBps"]
    )


def _size(n: float) -> str:
    for unit, scale in (("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:g} {unit}"
    return f"{n:g} B"


def collectives_display(frame: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for (variant, dtype), sub in frame.groupby(["variant", "dtype"], sort=False):
        row = {"variant": variant, "dtype": dtype}
        for _, r in sub.sort_values("bytes").iterrows():
            row[_size(r["bytes"])] = f"{r['latency_s'] * 1e3:.3g} ms · {r['busbw_GBps']:.3g} GB/s"
        rows.append(row)
    return pd.DataFrame(rows)


def plot_collectives(frame: pd.DataFrame, path: Path) -> str:
    """Latency and bus bandwidth against message size, one line per variant and dtype."""
    if frame.empty:
        return _no_data("allreduce latency and bandwidth", path)
    with plt.rc_context(STYLE):
        fig, (ax_lat, ax_bw) = plt.subplots(1, 2, figsize=(10, 3.8))
        for (variant, dtype), sub in frame.groupby(["variant", "dtype"], sort=False):
            sub = sub.sort_values("bytes")
            style = "-" if dtype == "float32" else "--"
            label = f"{variant} {dtype}"
            ax_lat.plot(sub["bytes"], sub["latency_s"] * 1e3, style, marker="o", label=label)
            ax_bw.plot(sub["bytes"], sub["busbw_GBps"], style, marker="o", label=label)
        sizes = sorted(frame["bytes"].unique())
        for ax in (ax_lat, ax_bw):
            ax.set_xscale("log", base=2)
            ax.set_xticks(sizes, [_size(b) for b in sizes], rotation=30, fontsize=8)
            ax.minorticks_off()
            ax.set_xlabel("message size")
        ax_lat.set_yscale("log")
        ax_lat.set_ylabel("allreduce latency (ms, median)")
        ax_lat.set_title("Latency (lower is better)")
        ax_bw.set_ylabel("bus bandwidth (GB/s)")
        ax_bw.set_title("Bus bandwidth (higher is better)")
        ax_bw.legend(fontsize=8, loc="upper left")
        return _save(fig, path)


def distributed_section(
    stats_sp: pd.DataFrame, collectives: Sequence[Mapping], plots_dir: Path
) -> tuple[str, str, str]:
    ddp = stats_sp[stats_sp["launcher"] == "torchrun"] if "launcher" in stats_sp else stats_sp[:0]
    parts = [
        '<p class="note">The book chapter\'s claims, from its own machine: '
        + "; ".join(html.escape(c) for c in BOOK_CLAIMS)
        + ". Each layout below keeps the global batch and the core budget; every rank is "
        "pinned to its own cores, and a step takes as long as its slowest rank.</p>"
    ]
    if len(ddp):
        parts.append(_table(ddp_display(ddp)))
    else:
        parts.append('<p class="empty">No data-parallel (torchrun) experiments.</p>')
    frame = collectives_frame(collectives)
    svg = plot_collectives(frame, Path(plots_dir) / "collectives.svg")
    parts.append("<h3>Allreduce microbenchmark</h3>")
    failed = [c for c in collectives if isinstance(c, Mapping) and c.get("status") != "ok"]
    if frame.empty:
        parts.append('<p class="empty">No collectives results.</p>')
    else:
        ranks = sorted({int(r) for r in frame["ranks"].dropna()})
        parts.append(
            f'<p class="note">allreduce (sum) between {", ".join(map(str, ranks))} ranks on '
            "this machine: median latency and bus bandwidth (nccl-tests' definition: bytes / "
            "time x 2(n-1)/n) per message size.</p>"
        )
        parts.append(_table(collectives_display(frame)))
        parts.append(f'<figure id="fig-collectives">{inline_svg(svg, "collectives")}</figure>')
    for c in failed:
        err = (c.get("error") or {}).get("message", "")
        parts.append(
            f'<p class="note">collectives {html.escape(str(c.get("variant")))} failed: '
            f"{html.escape(str(err))}</p>"
        )
    return ("distributed", "Distributed training (DDP)", "\n".join(parts))
