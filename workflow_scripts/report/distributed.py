"""The report's distributed section: data-parallel throughput per layout (ranks x
threads) and process-group backend, the accuracy experiments (time to train and
held-out accuracy) with the book's claims beside ours, and the allreduce
microbenchmark's latency and bus-bandwidth curves."""

from __future__ import annotations

import html
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import pandas as pd

from .. import launchers, workloads
from ..collectives import loop_latency_s
from ..spec import fields
from .figures import STYLE, inline_svg, no_data_svg, save_svg
from .formatting import fmt_int, fmt_num, fmt_speedup, fmt_spread, fmt_text, used_count
from .html import table_html
from .uncertainty import Comparison, Spread, compared_cell, compared_text, interval, verdict
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
    """``gloo``, or ``ccl shm``/``ccl tcp`` (``+ worker`` with oneCCL's worker thread,
    ``on a reserved CPU`` with comm_cpu)."""
    backend = row.get("dist_backend")
    backend = "gloo" if isnan(backend) else str(backend)
    if backend != "ccl":
        return backend
    text = f"ccl {row.get('ccl_transport') or 'shm'}"
    if _true(row.get("ccl_worker_offload")):
        text += " + worker"
        if _true(row.get("comm_cpu")):
            text += " on a reserved CPU"
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


def several_nodes(frame: pd.DataFrame) -> bool:
    """Some row ran on more than one node."""
    return "nodes" in frame and bool((frame["nodes"].map(_ranks) > 1).any())


def ddp_display(stats: pd.DataFrame, every: pd.DataFrame | None = None) -> pd.DataFrame:
    """The data-parallel layouts; ``every``: all the run's rows, where each row's group
    head is found (its "vs first in group" has its interval and verdict)."""
    rows = []
    nodes = several_nodes(stats)
    heads = {str(r["experiment"]): r for _, r in (stats if every is None else every).iterrows()}
    for _, r in stats.iterrows():
        head = heads.get(str(r.get("group_baseline")))
        rows.append(
            {
                "experiment": r["experiment"],
                "group": fmt_text(r["group"]),
                **({"nodes": fmt_int(_ranks(r.get("nodes")))} if nodes else {}),
                "ranks × threads": layout(r),
                "process group": process_group(r),
                "backend": fmt_text(r["backend"]),
                "precision": fmt_text(r["precision"]),
                "global batch": fmt_int(r["batch_size"]),
                "samples/s": fmt_spread(r["sps_median"], r["sps_min"], r["sps_max"], used_count(r)),
                "step median (s)": fmt_num(r["step_time_median_s"], 3),
                "vs first in group": (
                    compared_text(head, r)
                    if head is not None and head["experiment"] != r["experiment"]
                    else ""
                )
                or fmt_speedup(r.get("group_speedup")),
                "claimed": fmt_speedup(r.get("claim_speedup")),
                "peak RSS, all ranks (MB)": fmt_num(r["peak_rss_mb"], 0),
            }
        )
    return pd.DataFrame(rows)


def configuration_keys(frame: pd.DataFrame) -> list[str]:
    """What makes two accuracy runs the same configuration: their group and every field
    the registry compares by or that changes the training trajectory, except the seed
    (the runs of a seed sweep are one configuration, their spread the seeds')."""
    keys = ["group", *fields.compare_keys(*fields.COMPARE_ROLES), *fields.trajectory_keys()]
    return [k for k in dict.fromkeys(keys) if k != "seed" and k in frame]


def _seedless(experiment: str) -> str:
    """An experiment's id without its seed tag (``acc-r2-seed1`` -> ``acc-r2``)."""
    return re.sub(r"-seed\d+(?=-|$)", "", str(experiment))


def _seeds(values: pd.Series) -> str:
    seeds = sorted({int(v) for v in pd.to_numeric(values, errors="coerce").dropna()})
    return ", ".join(map(str, seeds))


def accuracy_rows(stats: pd.DataFrame) -> pd.DataFrame:
    """The experiments that trained for a number of epochs (and measured accuracy), one
    row per configuration (the seeds of a seed sweep together: medians over the seeds,
    accuracy min-max over every trial of every seed), each with its time-to-train
    speedup and accuracy change over its group's first."""
    if "epochs" not in stats:
        return stats[:0]
    runs = stats[pd.to_numeric(stats["epochs"], errors="coerce").fillna(0) > 0].copy()
    if runs.empty:
        return runs
    keys = configuration_keys(runs)
    config = pd.Series(
        ["|".join(map(str, values)) for values in runs[keys].itertuples(index=False)],
        index=runs.index,
    )
    rows = []
    for _, sub in runs.groupby(config, sort=False):
        row = sub.iloc[0].copy()
        row["experiment"] = (
            sub["experiment"].iloc[0] if len(sub) == 1 else _seedless(sub["experiment"].iloc[0])
        )
        row["seeds"] = _seeds(sub["seed"]) if "seed" in sub else ""
        row["n_seeds"] = len(sub)
        for col in ("train_time_s", "test_accuracy", "sps_median", "time_to_accuracy_s"):
            if col in sub:
                row[col] = pd.to_numeric(sub[col], errors="coerce").median()
        for col, how in (("test_accuracy_min", "min"), ("test_accuracy_max", "max")):
            row[col] = getattr(pd.to_numeric(sub[col], errors="coerce"), how)()
        row["n_accuracy"] = pd.to_numeric(sub["n_accuracy"], errors="coerce").sum()
        # every used trial's time to train, of every seed: its comparison's interval
        row["train_time_used"] = tuple(
            t for times in sub.get("train_time_used", ()) if isinstance(times, tuple) for t in times
        )
        if "n_reached" in sub:  # seeds whose trials reached the target
            row["seeds_reached"] = int((pd.to_numeric(sub["n_reached"], errors="coerce") > 0).sum())
        rows.append(row)
    acc = pd.DataFrame(rows).reset_index(drop=True)
    first = acc.groupby("group", sort=False, dropna=False).head(1).set_index("group")
    base_time = acc["group"].map(first["train_time_s"])
    base_acc = acc["group"].map(first["test_accuracy"])
    acc["time_speedup"] = base_time / acc["train_time_s"].where(acc["train_time_s"] > 0)
    acc["accuracy_change"] = acc["test_accuracy"] - base_acc
    acc["time_compared"] = time_comparisons(acc)
    return acc


def time_comparisons(acc: pd.DataFrame) -> list[Comparison | None]:
    """Each configuration's time-to-train speedup over its group's first (the head's
    time over its own), with its 95 % interval and verdict (uncertainty.py; the spread
    of log time to train pooled over the configurations, seeds and trials)."""
    times = [t if isinstance(t, tuple) else () for t in acc["train_time_used"]]
    spread = Spread.pooled(times)
    heads = acc.groupby("group", sort=False, dropna=False).head(1)
    head_of = dict(zip(heads["group"], heads.index, strict=True))
    out: list[Comparison | None] = []
    for i, r in acc.iterrows():
        h = head_of.get(r["group"])
        if h is None or h == i or not times[h] or not times[i]:
            out.append(None)
            continue
        ratio, lo, hi = interval(times[i], times[h], spread)
        out.append(
            Comparison("time", str(acc.at[h, "experiment"]), str(r["experiment"]), ratio, lo,
                       hi, len(times[h]), len(times[i]), verdict(lo, hi), spread=spread.sd,
                       df=spread.df)
        )  # fmt: skip
    return out


def _points(delta: Any) -> str:
    if isnan(delta):
        return ""
    return f"{100 * float(delta):+.1f}"


def _pct_spread(r: Mapping) -> str:
    n = int(r.get("n_accuracy") or 0)
    lo, hi = r.get("test_accuracy_min"), r.get("test_accuracy_max")
    return fmt_spread(100 * r["test_accuracy"], 100 * lo, 100 * hi, n, 1)


def _global_batch(r: Mapping) -> str:
    """The global batch, and each rank's share of it where the batch grows with the
    ranks (batch_scaling weak)."""
    text = fmt_int(r["batch_size"])
    if str(r.get("batch_scaling")) == "weak" and text:
        world = _ranks(r.get("ranks")) * _ranks(r.get("nodes"))
        text += f" (weak: {int(r['batch_size']) // world}/rank)"
    return text


def _time_to_target(r: Mapping) -> str:
    target = r.get("target_accuracy")
    if isnan(target):
        return ""
    if isnan(r.get("time_to_accuracy_s")):
        return f"not reached ({100 * float(target):g} %)"
    text = f"{fmt_num(r['time_to_accuracy_s'], 2)} (to {100 * float(target):g} %)"
    n, reached = int(r.get("n_seeds") or 1), r.get("seeds_reached")
    if n > 1 and not isnan(reached) and int(reached) < n:
        text += f", {int(reached)} of {n} seeds"
    return text


def _time_text(r: Mapping) -> str:
    return compared_cell(r, "time_compared", "time_speedup")


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
                "global batch": _global_batch(r),
                "lr": fmt_num(r.get("lr"), 4),
                "seeds": r.get("seeds") or "",
                "time to train (s)": fmt_num(r["train_time_s"], 2),
                "speedup": _time_text(r),
                "time to target (s)": _time_to_target(r),
                "test accuracy (%)": _pct_spread(r),
                "Δ accuracy (points)": _points(r["accuracy_change"]),
                "samples/s": fmt_num(r["sps_median"]),
            }
        )
    frame = pd.DataFrame(rows)
    for col in ("seeds", "time to target (s)"):  # only where some run has one
        if col in frame and not frame[col].astype(bool).any():
            frame = frame.drop(columns=col)
    return frame


def claims_display(acc: pd.DataFrame) -> pd.DataFrame:
    """The book's claims against ours: the fastest multi-rank run of each kind against
    the group's one-process fp32 Gloo run (its first), by time to train: a row per
    claim, a column per group that has such a reference (e.g. the fixed and the
    weak-scaled batch)."""
    rows = {what: {"claim": what, "book (its machine)": claim} for what, claim, _, _ in BOOK_CLAIMS}
    for _, sub in acc.groupby("group", sort=False, dropna=False):
        base = sub.iloc[0]
        if _ranks(base["ranks"]) != 1 or str(base["precision"]) != "fp32":
            continue  # no one-process fp32 reference in this group
        for what, _claim, backend, precision in BOOK_CLAIMS:
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
                    f"{_time_text(best)} ({best['experiment']}, "
                    f"{layout(best)}, {best['precision']}), accuracy "
                    f"{_points(best['accuracy_change'])} points"
                )
            rows[what][f"ours, against {base['experiment']}"] = ours
    found = any(len(row) > 2 for row in rows.values())  # some group had a reference
    return pd.DataFrame(list(rows.values())) if found else pd.DataFrame()


#: how the report names the data sets that ``epochs`` measures accuracy on
DATA_SETS = {
    "digits": "scikit-learn's digits (1437 training images, upscaled; 360 held out)",
    "keywords": (
        "the study's generated keyword-order task (a synthetic text-classification task, "
        "not a real text data set: each sequence holds one keyword of every class among "
        f"{workloads.KEYWORDS_BACKGROUND} kinds of background token, and its label is the "
        "class whose keyword comes first, so that a bag of words scores chance; "
        f"{workloads.KEYWORDS_TRAIN} training sequences, {workloads.KEYWORDS_TEST} held out)"
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
        '<p class="note">Each run of a group trains the same model for a fixed number of '
        f"epochs on {' or '.join(sets)}, then scores it on the held-out test split. With "
        "a fixed global batch (batch_scaling fixed) N ranks take the same optimizer steps "
        "as one process; with a weak-scaled batch (batch_scaling weak: each rank's batch "
        "fixed, the global batch and learning rate N times larger, the rate warmed up) "
        "they take N times fewer, larger steps: faster, and the accuracy may drop. "
        "The speedup is the time to train of the group's first run over this run's; "
        "Δ accuracy is the change in percentage points against that run. Runs that "
        "differ only in their seed are one row: medians over the seeds, test accuracy "
        "median (min–max over every trial of every seed). Time to target: training time "
        "(scoring excluded) until the held-out accuracy, scored evals_per_epoch times per "
        "epoch, first reached the target.</p>"
    )
    parts.append(table_html(accuracy_display(acc)))
    claims = claims_display(acc)
    if len(claims):
        parts.append(table_html(claims))
    return parts


def collectives_frame(results: Sequence[Mapping]) -> pd.DataFrame:
    """One row per variant, rank count, dtype and message size of the collectives
    results: every rank count that ran ok (a record with a failed count keeps the
    others)."""
    rows = []
    for res in results:
        if not isinstance(res, Mapping):
            continue
        if "by_ranks" not in res and res.get("status") != "ok":
            continue  # (a record of one rank count, before by_ranks)
        for r in res.get("results") or []:
            rows.append(
                {
                    "variant": res.get("variant"),
                    "fabric": fabric(res),
                    "ranks": r.get("ranks", res.get("ranks")),
                    "nodes": r.get("nodes", res.get("nodes")) or 1,
                    "dtype": r["dtype"],
                    "bytes": r["bytes"],
                    "latency_s": loop_latency_s(r),
                    "busbw_GBps": r["busbw_GBps"],
                }
            )
    return pd.DataFrame(
        rows,
        columns=["variant", "fabric", "ranks", "nodes", "dtype", "bytes", "latency_s",
                 "busbw_GBps"],
    )  # fmt: skip


def fabric(res: Mapping) -> str:
    """The libfabric providers oneCCL opened in a collectives run, as its rank 0 recorded
    them (``shm``, ``tcp``, ``shm + tcp``: the node's and the network's); empty for Gloo
    and for records from before they were recorded."""
    group = res.get("group") if isinstance(res.get("group"), Mapping) else {}
    config = group.get("ccl_config") if isinstance(group.get("ccl_config"), Mapping) else {}
    ofi = config.get("ofi") if isinstance(config.get("ofi"), Mapping) else {}
    providers = [str(p) for p in ofi.get("providers") or []]
    return " + ".join(dict.fromkeys(providers))


def _placement(ranks: Any, nodes: Any) -> str:
    """A collectives run's ranks: ``4``, or ``2 × 1`` (nodes × ranks on each)."""
    return f"{_ranks(nodes)} × {fmt_int(ranks)}" if _ranks(nodes) > 1 else fmt_int(ranks)


def _size(n: float) -> str:
    for unit, scale in (("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:g} {unit}"
    return f"{n:g} B"


def collectives_display(frame: pd.DataFrame) -> pd.DataFrame:
    rows = []
    nodes = several_nodes(frame)
    providers = frame["fabric"].astype(bool).any()
    keys = ["variant", "nodes", "ranks", "dtype"]
    for (variant, n, ranks, dtype), sub in frame.groupby(keys, sort=False):
        row = {"variant": variant}
        if providers:  # what oneCCL's transport was, as libfabric providers
            row["libfabric"] = sub["fabric"].iloc[0] or "—"
        if nodes:
            row.update({"nodes × ranks": _placement(ranks, n), "dtype": dtype})
        else:
            row.update({"ranks": fmt_int(ranks), "dtype": dtype})
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
        several = len(frame.groupby(["nodes", "ranks"])) > 1
        for (variant, n, ranks, dtype), sub in frame.groupby(
            ["variant", "nodes", "ranks", "dtype"], sort=False
        ):
            sub = sub.sort_values("bytes")
            style = "-" if dtype == "float32" else "--"
            where = _placement(ranks, n).replace(" ", "")
            label = f"{variant} ×{where} {dtype}" if several else f"{variant} {dtype}"
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
    layouts = launchers.layout_names()
    ddp = stats_sp[stats_sp["launcher"].isin(layouts)] if "launcher" in stats_sp else stats_sp[:0]
    if "epochs" in ddp:  # the accuracy experiments have their own table
        ddp = ddp[pd.to_numeric(ddp["epochs"], errors="coerce").fillna(0) <= 0]
    parts = [
        '<p class="note">Each layout below keeps the global batch and the core budget; '
        "every rank is pinned to its own cores, and a step takes as long as its slowest "
        "rank."
        + (" A run on several nodes has the cores of each (nodes)." if several_nodes(ddp) else "")
        + "</p>"
    ]
    if len(ddp):
        parts.append(table_html(ddp_display(ddp, stats_sp)))
    else:
        names = ", ".join(sorted(layouts))
        parts.append(f'<p class="empty">No data-parallel ({names}) throughput experiments.</p>')
    parts += accuracy_part(stats_sp)
    frame = collectives_frame(collectives)
    svg = plot_collectives(frame, Path(plots_dir) / "collectives.svg")
    parts.append("<h3>Allreduce microbenchmark</h3>")
    failed = [c for c in collectives if isinstance(c, Mapping) and c.get("status") != "ok"]
    if frame.empty:
        parts.append('<p class="empty">No collectives results.</p>')
    else:
        ranks = sorted({int(r) for r in frame["ranks"].dropna()})
        nodes = sorted({_ranks(n) for n in frame["nodes"]})
        counts = f"{', '.join(map(str, ranks))} rank{'s' if ranks != [1] else ''}"
        where = (
            f"{counts} on each of {'/'.join(map(str, nodes))} nodes"
            if nodes != [1]
            else f"{counts} on this machine"
        )
        parts.append(
            f'<p class="note">allreduce (sum) between {where} (each count a run of its '
            "own): latency per call of a timed loop "
            "after warm-up, and bus bandwidth (nccl-tests' definition: bytes / time x "
            "2(n-1)/n) per message size."
            + (
                " libfabric: the providers oneCCL opened, as it said when its group "
                "started (within a node, then between nodes).</p>"
                if frame["fabric"].astype(bool).any()
                else "</p>"
            )
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
