"""Every comparison the report states, gathered for ``comparisons.csv`` and the
report's section "How sure each comparison is" (the method: :mod:`uncertainty`).

Kinds: ``baseline`` (a run of the baseline's workload against the baseline),
``step`` (a ladder rung against the rung it builds on), ``group`` (a run against its
group's first, same workload), ``reference`` (a run against the plain fp32 eager run
of its workload, by family; inference at the same batch), ``backend`` (a backend
variant against eager at the same configuration) and ``compile`` (a compiled run
against its eager twin); and ``time``: an accuracy run's time to train against its
group's first (its ratio a speedup in time: the first's time over its own)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

import pandas as pd

from .compare import differences, same_workload
from .distributed import accuracy_rows
from .families import reference_comparisons
from .html import table_html
from .uncertainty import (
    MARGIN,
    Comparison,
    Spread,
    alpha_of,
    between,
    bounds_text,
    counts,
    looks_of,
    margin_of,
    method_text,
    node_spread_of,
    spread_of,
)
from .values import isnan

#: the table's kinds in the order they are listed
KINDS = ("baseline", "step", "reference", "group", "backend", "compile", "time")


def _found(values: Iterable) -> list[Comparison]:
    return [c for c in values if isinstance(c, Comparison)]


def stated_comparisons(
    stats: pd.DataFrame,
    baseline: str | None,
    ladder: pd.DataFrame,
    matrix: pd.DataFrame,
    compiled: pd.DataFrame,
) -> list[Comparison]:
    """What the report compares, each with its interval and verdict (``stats``: with
    ``group_baseline``; ``ladder``: with ``step_compared``; ``matrix`` and
    ``compiled``: with ``compared``)."""
    found: list[Comparison] = []
    by_id = {str(r["experiment"]): r for _, r in stats.iterrows()}
    base = by_id.get(str(baseline)) if baseline is not None else None
    if base is not None:
        found += [between(base, r, "baseline") for r in by_id.values() if same_workload(base, r)]
    for column in ("step_compared",):
        if column in ladder:
            found += _found(ladder[column])
    found += reference_comparisons(stats, baseline)
    for r in by_id.values():
        head = by_id.get(str(r.get("group_baseline")))
        if head is not None and same_workload(head, r):
            found.append(between(head, r, "group"))
    for frame in (matrix, compiled):
        if "compared" in frame:
            found += _found(frame["compared"])
    accuracy = accuracy_rows(stats)
    if "time_compared" in accuracy:
        found += _found(accuracy["time_compared"])
    found = [_with_change(c, by_id) for c in found]
    return sorted(found, key=lambda c: KINDS.index(c.kind) if c.kind in KINDS else len(KINDS))


def _with_change(c: Comparison, by_id: dict) -> Comparison:
    """``c`` naming the settings its experiment changes over its baseline."""
    if c.change or c.baseline not in by_id or c.experiment not in by_id:
        return c
    return replace(c, change=", ".join(differences(by_id[c.baseline], by_id[c.experiment])))


def run_spread(stats: pd.DataFrame) -> Spread:
    return spread_of(stats.iloc[0]) if len(stats) else Spread(float("nan"), 0)


def comparisons_section(comparisons: pd.DataFrame, stats: pd.DataFrame) -> tuple[str, str, str]:
    """The method, the counts by verdict and every comparison, undecided ones first."""
    title = "How sure each comparison is"
    margin = margin_of(stats.iloc[0]) if len(stats) else MARGIN
    looks = looks_of(stats.iloc[0]) if len(stats) else 1
    alpha = alpha_of(stats.iloc[0]) if len(stats) else 0.05
    nodes = node_spread_of(stats.iloc[0]) if len(stats) else None
    note = f'<p class="note">{method_text(run_spread(stats), margin, looks, alpha, nodes)}</p>'
    if not len(comparisons):
        return ("comparisons", title, note + '<p class="empty">No comparison to state.</p>')
    n = counts(comparisons)
    summary = (
        f'<p class="counts">{sum(n.values())} pairs compared: {n["faster"]} faster, '
        f"{n['slower']} slower, {n['same']} the same within ±{100 * margin:g} %, "
        f"<b>{n['undecided']} undecided</b>.{fdr_text(comparisons)}</p>"
    )
    order = {"undecided": 0, "faster": 1, "slower": 2, "same": 3}
    pairs = (
        comparisons.groupby(["baseline", "experiment"], sort=False)
        .agg({**{c: "first" for c in comparisons.columns}, "kind": ", ".join})
        .reset_index(drop=True)
    )
    pairs["_o"] = pairs["verdict"].map(order)
    rows = [
        {
            "experiment": r["experiment"],
            "over": r["baseline"],
            "ratio": f"{r['ratio']:.2f}×",
            "interval": ""
            if isnan(r["ci_low"])
            else f"{bounds_text(r['ci_low'], r['ci_high'])} ({100 * r['confidence']:.4g} %)",
            "trials": f"{int(r['n_experiment'])} vs {int(r['n_baseline'])}",
            "spread": spread_text(r),
            "verdict": r["verdict"],
            "what differs": r["change"],
            "compared as": r["kind"],
        }
        for _, r in pairs.sort_values("_o", kind="stable").iterrows()
    ]
    return (
        "comparisons",
        title,
        note
        + summary
        + f"<details><summary>All {len(rows)} pairs, undecided first (each comparison "
        "also in comparisons.csv, one row per kind)</summary>"
        + table_html(pd.DataFrame(rows))
        + "</details>",
    )


def spread_text(r) -> str:
    """``6.1 % (4.2 df)``: the spread a pair's interval used, with what its sides' nodes
    added where they differ (``; nodes 3.0 %``)."""
    if isnan(r["spread"]):
        return ""
    node = r.get("node_spread")
    nodes = "" if isnan(node) or not node else f"; nodes {100 * node:.1f} %"
    return f"{100 * r['spread']:.1f} % ({r['df']:.3g} df{nodes})"


def fdr_text(comparisons: pd.DataFrame) -> str:
    """`` Of the 12 faster or slower verdicts, Benjamini-Hochberg keeps 11 ...``: how
    many decided differences hold at a 5 % false discovery rate over the table."""
    pairs = comparisons.drop_duplicates(["baseline", "experiment"])
    decided = pairs["verdict"].isin(["faster", "slower"])
    if not decided.any():
        return ""
    kept = int(pairs.loc[decided, "fdr_kept"].fillna(False).astype(bool).sum())
    return (
        f" Of the {int(decided.sum())} faster or slower verdicts, {kept} hold at a 5 % false "
        f"discovery rate over all {len(pairs)} pairs (Benjamini-Hochberg on their p-values: "
        "of the differences kept, at most 5 % are expected to be wrong); each faster or "
        "slower verdict alone is wrong at most 2.5 % of the time."
    )
