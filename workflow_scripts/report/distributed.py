"""The report's distributed section: data-parallel throughput per layout (ranks x
threads) and process-group backend, the accuracy experiments (time to train and
held-out accuracy) with the book's claims beside ours, and the allreduce
microbenchmark's latency and bus-bandwidth curves."""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import pandas as pd

from .. import workloads
from ..collectives import loop_latency_s
from .figures import STYLE, inline_svg, no_data_svg, save_svg
from .formatting import fmt_int, fmt_num, fmt_speedup, fmt_spread, fmt_text, used_count
from .html import table_html
from .values import isnan

# The book chapter's claims (../shared/STUDY.md), measured on its own machine (a small
# CNN on CIFAR-10, 5 epochs, training time and test accuracy): several ranks on one
# machine against one process using every core. (what, its claim, our rows' filter)
BOOK_CLAIMS = (
    ("Gloo, several ranks", "about 1.25× faster, the same accuracy", "gloo", "fp32"),
    ("oneCCL, several ranks", "more than 1.4× faster", "ccl", "fp32"),
    ("oneCCL, any setting", "about 2× faster if some accuracy is given up", "ccl", None),
)


def process_group(row: Mapping) -> str:
    """``gloo``, or ``ccl shm``/``ccl tcp`` (``+ worker`` with oneCCL's worker thread)."""
    backend = row.get("dist_backend")
    backend = "gloo" if isnan(backend) else str(backend)
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


def _ranks(value: Any) -> int:
    """A ranks cell: 1 where it is empty (a single process)."""
    return 1 if isnan(value) else int(value)


def layout(row: Mapping) -> str:
    threads = row.get("threads")
    return f"{_ranks(row.get('ranks'))} × {'all' if isnan(threads) else int(threads)}"


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
                "global batch": fmt_int(r["batch_size"]),
                "samples/s": fmt_spread(r["sps_median"], r["sps_min"], r["sps_max"], used_count(r)),
                "step median (s)": fmt_num(r["step_time_median_s"], 3),
                "vs first in group": fmt_speedup(r.get("group_speedup")),
                "claimed": fmt_speedup(r.get("claim_speedup")),
                "peak RSS, all ranks (MB)": fmt_num(r["peak_rss_mb"], 0),
            }
        )
    return pd.DataFrame(rows)


def accuracy_rows(stats: pd.DataFrame) -> pd.DataFrame:
    """The experiments that trained for a number of epochs (and measured accuracy),
    each with its time-to-train speedup and accuracy change over its group's first."""
    if "epochs" not in stats:
        return stats[:0]
    acc = stats[pd.to_numeric(stats["epochs"], errors="coerce").fillna(0) > 0].copy()
    if acc.empty:
        return acc
    first = acc.groupby("group", sort=False, dropna=False).head(1).set_index("group")
    base_time = acc["group"].map(first["train_time_s"])
    base_acc = acc["group"].map(first["test_accuracy"])
    acc["time_speedup"] = base_time / acc["train_time_s"].where(acc["train_time_s"] > 0)
    acc["accuracy_change"] = acc["test_accuracy"] - base_acc
    return acc


def _points(delta: Any) -> str:
    if isnan(delta):
        return ""
    return f"{100 * float(delta):+.1f}"


def _pct_spread(r: Mapping) -> str:
    n = int(r.get("n_accuracy") or 0)
    lo, hi = r.get("test_accuracy_min"), r.get("test_accuracy_max")
    return fmt_spread(100 * r["test_accuracy"], 100 * lo, 100 * hi, n, 1)


def accuracy_display(acc: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for _, r in acc.iterrows():
        rows.append(
            {
                "experiment": r["experiment"],
                "ranks × threads": layout(r),
                "process group": process_group(r),
                "precision": fmt_text(r["precision"]),
                "epochs": fmt_int(r["epochs"]),
                "global batch": fmt_int(r["batch_size"]),
                "time to train (s)": fmt_num(r["train_time_s"], 2),
                "speedup": fmt_speedup(r["time_speedup"]),
                "test accuracy (%)": _pct_spread(r),
                "Δ accuracy (points)": _points(r["accuracy_change"]),
                "samples/s": fmt_num(r["sps_median"]),
            }
        )
    return pd.DataFrame(rows)


def claims_display(acc: pd.DataFrame) -> pd.DataFrame:
    """The book's claims against ours: the fastest multi-rank run of each kind against
    the group's one-process fp32 Gloo run (its first), by time to train."""
    rows = []
    for _, sub in acc.groupby("group", sort=False, dropna=False):
        base = sub.iloc[0]
        if _ranks(base["ranks"]) != 1 or str(base["precision"]) != "fp32":
            continue  # no one-process fp32 reference in this group
        for what, claim, backend, precision in BOOK_CLAIMS:
            pick = sub[
                (sub["ranks"].map(_ranks) > 1)
                & (sub["dist_backend"].fillna("gloo") == backend)
                & sub["time_speedup"].notna()
            ]
            if precision:
                pick = pick[pick["precision"] == precision]
            if pick.empty:
                ours = "not run"
            else:
                best = pick.loc[pick["time_speedup"].idxmax()]
                ours = (
                    f"{fmt_speedup(best['time_speedup'])} ({best['experiment']}, "
                    f"{layout(best)}, {best['precision']}), accuracy "
                    f"{_points(best['accuracy_change'])} points"
                )
            rows.append(
                {
                    "claim": what,
                    "book (its machine)": claim,
                    f"ours, against {base['experiment']}": ours,
                }
            )
    return pd.DataFrame(rows)


#: how the report names the data sets that ``epochs`` measures accuracy on
DATA_SETS = {
    "digits": "scikit-learn's digits (1437 training images, upscaled; 360 held out)",
    "keywords": (
        "the study's generated keyword task (a synthetic text-classification task, not a "
        f"real text data set: each sequence holds {workloads.KEYWORDS_PER_SEQUENCE} "
        f"keywords of its class among random tokens; {workloads.KEYWORDS_TRAIN} training "
        f"sequences, {workloads.KEYWORDS_TEST} held out)"
    ),
}


def accuracy_part(stats: pd.DataFrame) -> list[str]:
    acc = accuracy_rows(stats)
    parts = ["<h3>Accuracy: time to train and held-out test accuracy</h3>"]
    if acc.empty:
        return parts + ['<p class="empty">No accuracy experiments (epochs) in this run.</p>']
    data = set(acc["data"]) if "data" in acc else {"digits"}
    sets = [DATA_SETS[d] for d in ("digits", "keywords") if d in data]
    parts.append(
        '<p class="note">Each run of a group trains the same model from the same seed for '
        f"a fixed number of epochs on {' or '.join(sets)}, at the same global batch (so "
        "the same number of optimizer steps), then scores it on the held-out test split. "
        "The speedup is the time to train of the group's first run over this run's; "
        "Δ accuracy is the change in percentage points against that run. Test accuracy: "
        "median over the trials (min–max).</p>"
    )
    parts.append(table_html(accuracy_display(acc)))
    claims = claims_display(acc)
    if len(claims):
        parts.append(table_html(claims))
    return parts


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
                    "latency_s": loop_latency_s(r),
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
        return no_data_svg("allreduce latency and bandwidth", path)
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
        ax_lat.set_ylabel("allreduce latency (ms per call, timed loop)")
        ax_lat.set_title("Latency (lower is better)")
        ax_bw.set_ylabel("bus bandwidth (GB/s)")
        ax_bw.set_title("Bus bandwidth (higher is better)")
        ax_bw.legend(fontsize=8, loc="upper left")
        return save_svg(fig, path)


def distributed_section(
    stats_sp: pd.DataFrame, collectives: Sequence[Mapping], plots_dir: Path
) -> tuple[str, str, str]:
    ddp = stats_sp[stats_sp["launcher"] == "torchrun"] if "launcher" in stats_sp else stats_sp[:0]
    ddp = ddp[~ddp["experiment"].isin(accuracy_rows(stats_sp)["experiment"])]
    parts = [
        '<p class="note">Each layout below keeps the global batch and the core budget; '
        "every rank is pinned to its own cores, and a step takes as long as its slowest "
        "rank.</p>"
    ]
    if len(ddp):
        parts.append(table_html(ddp_display(ddp)))
    else:
        parts.append('<p class="empty">No data-parallel (torchrun) throughput experiments.</p>')
    parts += accuracy_part(stats_sp)
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
        parts.append(table_html(collectives_display(frame)))
        parts.append(f'<figure id="fig-collectives">{inline_svg(svg, "collectives")}</figure>')
    for c in failed:
        err = (c.get("error") or {}).get("message", "")
        parts.append(
            f'<p class="note">collectives {html.escape(str(c.get("variant")))} failed: '
            f"{html.escape(str(err))}</p>"
        )
    return ("distributed", "Distributed training (DDP)", "\n".join(parts))
