"""The report's first lines: on this CPU, the fastest configuration, its speedup over
the fp32 baseline and its cost per million samples; how much was measured; and what
undermines it (budget-cut runs, noise, diverging losses)."""

from __future__ import annotations

import html
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd

from ..util import finite
from .compare import config_text, geomean, workload_text
from .formatting import cut_reason, fmt_num, fmt_usd, steps_text
from .machines import cpu_description, cpu_flags, isa_verdict
from .stats import (
    OK,
    baseline_sps,
    best_like_baseline,
    incorrect,
    left_out,
    like_baseline,
    trial_counts,
)
from .uncertainty import VERDICTS, Comparison, between, bounds_text, counts
from .values import isnan


def headline_pairs(
    stats: pd.DataFrame,
    baseline: str | None,
    diverging: Sequence[str],
    stated: Iterable[Comparison],
) -> set[tuple[str, str]]:
    """The (baseline, experiment) pairs whose ratio the headline states: the fastest
    configuration against the baseline (and the candidate it names as known to beat
    the baseline where the fastest is not: :func:`pick`), and those its family lines
    state (each family's fastest training and served runs against their fp32 eager
    runs: ``families.family_picks``, ``inference_picks``). The adaptive rounds measure
    these until their interval is within the margin (plan/rounds.py)."""
    pairs = {(c.baseline, c.experiment) for c in stated}
    if baseline is not None and len(stats):
        pairs |= stated_pairs(pick(stats, baseline, diverging), baseline)
    return {p for p in pairs if p[0] != p[1]}


def stated_pairs(answer: Pick | None, baseline: str) -> set[tuple[str, str]]:
    """The pairs with ``baseline`` that the headline's answer states: its fastest, and
    the candidate it names as known to beat the baseline where the fastest is not."""
    if answer is None:
        return set()
    pairs = {(str(baseline), str(answer.best["experiment"]))}
    if answer.known_faster is not None:
        pairs.add((str(baseline), answer.known_faster.experiment))
    return pairs


@dataclass(frozen=True)
class Pick:
    """The headline's answer: the fastest of the ``k`` candidates that train the
    baseline's workload (``best``; ``ref``: the baseline, or the best without one),
    its comparison with the baseline (``against``, simultaneous over the candidates:
    ``uncertainty.between``) and, where the second fastest is not known to be slower
    than it at that confidence, the second's comparison with it (``runner_up``); where
    the best is not known to beat the baseline, the fastest candidate that is, at the
    same simultaneous confidence (``known_faster``: a pick of few trials may not be
    decided while a runner-up of more trials is)."""

    best: pd.Series
    ref: pd.Series
    k: int
    against: Comparison
    runner_up: Comparison | None
    known_faster: Comparison | None = None

    @property
    def crowned(self) -> bool:
        """Whether the best is known to beat the baseline (or is the baseline)."""
        return self.best["experiment"] == self.ref["experiment"] or self.against.verdict == (
            "faster"
        )


def pick(stats: pd.DataFrame, baseline: str | None, diverging: Sequence[str] = ()) -> Pick | None:
    """The headline's :class:`Pick` (None: no candidate finished with a throughput)."""
    candidates = like_baseline(stats, baseline, diverging) if len(stats) else stats
    if not len(candidates):
        return None
    best = candidates.iloc[0]
    own = stats[stats["experiment"] == baseline] if baseline is not None else stats.iloc[:0]
    ref = own.iloc[0] if len(own) else best
    k = max(1, int((candidates["experiment"] != ref["experiment"]).sum()))
    runner_up = between(best, candidates.iloc[1], candidates=k) if len(candidates) > 1 else None
    if runner_up is not None and runner_up.verdict == "slower":
        runner_up = None
    against = between(ref, best, "baseline", candidates=k)
    known = None
    if against.verdict != "faster" and best["experiment"] != ref["experiment"]:
        # (fastest first: the first candidate known to beat the baseline is the fastest
        # of those; the confidence is simultaneous over all k, so the claim is covered)
        for _, row in candidates.iloc[1:].iterrows():
            if row["experiment"] != ref["experiment"]:
                c = between(ref, row, "baseline", candidates=k)
                if c.verdict == "faster":
                    known = c
                    break
    return Pick(best, ref, k, against, runner_up, known)


def _b(id_: str, text: str) -> str:
    return f'<b id="hl-{id_}">{html.escape(text)}</b>'


def truncated(stats: pd.DataFrame) -> pd.DataFrame:
    """Experiments (step-count ones, not epochs) whose timed steps are fewer than the
    spec's ``steps``: the time budget, or a run that stopped early."""
    steps = pd.to_numeric(stats["steps"], errors="coerce")
    timed = pd.to_numeric(stats["steps_timed"], errors="coerce")
    epochs = pd.to_numeric(stats["epochs"], errors="coerce").fillna(0)
    # (a run that stopped because its step time was known well enough is not cut short)
    reason = stats["stop_reason"] if "stop_reason" in stats else pd.Series("", index=stats.index)
    precise = reason.fillna("").astype(str) == "precision"
    return stats[(epochs == 0) & steps.notna() & timed.notna() & (timed < steps) & ~precise]


#: the first line of a pre-flight's headline
PREFLIGHT = (
    "<b>A pre-flight</b>: every experiment ran at its real size for one warm-up and one "
    "timed step (an epochs run: a few steps of one epoch), once. It says what runs and "
    "what fails, and roughly how fast; its throughputs and accuracies are not the "
    "study's measurements (run the study for those)."
)


@dataclass(frozen=True)
class Findings:
    """What the report found, as its headline reads it: the summary with the records'
    extras (``frame``), the records, each experiment's statistics, the baseline, the
    costs, the loss check, the compiled pairs, the machines compared (None: this one
    alone), a line per workload family (``families.family_lines``), and every
    comparison the report states (:func:`uncertainty.comparisons_frame`), and what a
    budget's plan left out (:func:`left_out_by_plan`)."""

    frame: pd.DataFrame
    records: Sequence[Any]
    stats: pd.DataFrame
    baseline: str | None
    costs: pd.DataFrame
    check: pd.DataFrame
    compiled: pd.DataFrame
    machines: Mapping | None = None
    families: Sequence[str] = ()
    comparisons: pd.DataFrame | None = None
    plan: Mapping | None = None


def headline_html(found: Findings) -> str:
    """The headline box at the top of the page."""
    frame, records, stats, baseline = found.frame, found.records, found.stats, found.baseline
    costs, check, compiled, comparisons = (
        found.costs,
        found.check,
        found.compiled,
        found.comparisons,
    )
    flags = cpu_flags(frame) if len(frame) else set()
    isa, meaning = isa_verdict(flags)
    cpu = cpu_description(frame, records) if len(frame) else "no trials"
    lead = [f"On this CPU, {_b('cpu', cpu)}, ISA {_b('isa', isa)} ({html.escape(meaning)})"]
    base = baseline_sps(stats, baseline)
    diverging = (
        []
        if check is None or not len(check)
        else (list(check.loc[check["verdict"] == "diverges", "experiment"]))
    )
    answer = pick(stats, baseline, diverging)
    fastest = best_like_baseline(stats, baseline) if len(stats) else None
    if answer is None:
        lead.append(": no configuration finished with a throughput (see Failures).")
    else:
        best, ref = answer.best, answer.ref
        # crowned only when known to beat the baseline, else "measured"
        lead.append(
            f", the fastest {'' if answer.crowned else 'measured '}configuration of "
            f"{html.escape(workload_text(ref))} is "
            f"{_b('best', str(best['experiment']))} ({html.escape(config_text(best))}) at "
            f"{_b('sps', fmt_num(best['sps_median']))} samples/s"
        )
        lead.append(_runner_up(answer.runner_up))
        if not isnan(base) and base > 0:
            lead.append(_against_baseline(answer, baseline, base))
        measured = costs[costs["throughput"] == "measured"] if len(costs) else costs
        if len(measured):
            c = measured.iloc[0]
            lead.append(
                f", at {_b('cost', fmt_usd(c['best_usd_per_million']))} per million samples "
                f"({fmt_usd(c['baseline_usd_per_million'])} for the baseline) at "
                f"${fmt_num(c['usd_per_hour'], 4)}/hour ({html.escape(str(c['name']))})"
            )
        else:
            lead.append(" (no price of this machine configured, so no cost)")
        lead.append(".")
        if fastest is not None and fastest["experiment"] != best["experiment"]:
            lead.append(
                f" ({html.escape(str(fastest['experiment']))} ran faster, at "
                f"{fmt_num(fastest['sps_median'])} samples/s, but its losses diverge from "
                "fp32 eager's: see Correctness.)"
            )
    items = [_measured(frame, stats), left_out_by_plan(found.plan)[0], _budget(stats),
             _noise(frame, stats, records)]  # fmt: skip
    items.append(_decided(comparisons))
    if any(isinstance(r, Mapping) and (r.get("spec") or {}).get("preflight") for r in records):
        items.insert(0, PREFLIGHT)
    items.append(_correctness(check))
    items += list(found.families)
    if len(compiled):
        g = geomean(compiled["speedup"])
        if not isnan(g):
            items.append(
                f"torch.compile: {_b('compile', f'{g:.2f}×')} eager (geometric mean over "
                f"{len(compiled)} like-for-like pair{'s' if len(compiled) > 1 else ''}: "
                f"{html.escape(', '.join(compiled['experiment']))}; "
                f"{html.escape(_verdicts(compiled))}); its compile cost is in "
                "Compile latency and memory."
            )
    machines = found.machines
    if machines and machines.get("cheapest"):
        name, exp, cost, sps = machines["cheapest"]
        items.append(
            f"Across the machines compared ({machines['matched']} matching experiments): the "
            f"cheapest per sample is {_b('cheapest', str(name))} running {html.escape(str(exp))} "
            f"at {fmt_num(sps)} samples/s, {html.escape(fmt_usd(cost))} per million samples."
        )
    lis = "".join(f"<li>{i}</li>" for i in items if i)
    return f'<div class="headline"><p class="lead">{"".join(lead)}</p><ul>{lis}</ul></div>'


def _runner_up(c: Comparison | None) -> str:
    """`` (or runner-up, 0.98× [0.93–1.03] of it: the two are not told apart)`` where the
    second fastest is not known to be slower than the first (:func:`pick`)."""
    if c is None:
        return ""
    interval = "" if isnan(c.ci_low) else html.escape(f" [{bounds_text(c.ci_low, c.ci_high)}]")
    return (
        f" (or {_b('runner-up', c.experiment)}, {c.ratio:.2f}×{interval} of it: the two "
        "are not told apart)"
    )


def _against_baseline(answer: Pick, baseline: Any, base: float) -> str:
    """``, 3.20× [2.9–3.5] the fp32 eager baseline (...): faster``; a fastest run not
    known to beat the baseline says so. The interval is simultaneous over the
    candidates the fastest was picked from (:func:`pick`)."""
    c, best, k = answer.against, answer.best, answer.k
    ratio = f"{(best['sps_median'] / base) if isnan(c.ratio) else c.ratio:.2f}×"
    # (an interval simultaneous over the candidates: wider than the same pair's elsewhere)
    of = f"; the fastest of {k}" if k > 1 else ""
    ci = "" if isnan(c.ci_low) else html.escape(f" [{bounds_text(c.ci_low, c.ci_high)}{of}]")
    text = (
        f", {_b('speedup', ratio)}{ci} the fp32 eager baseline ({html.escape(str(baseline))}, "
        f"{fmt_num(base)} samples/s"
    )
    if best["experiment"] == baseline:
        return text + ")"
    if c.verdict == "faster":
        over = f", counting that it was picked as the fastest of {k}" if k > 1 else ""
        return text + f"; {_b('verdict', 'faster')} at 95 % confidence{over})"
    if isnan(c.ci_low):
        why = " (one trial each: no interval)"
    elif c.verdict == "same":
        why = f" (the same within ±{100 * c.margin:g} %)"
    else:
        why = f" (its interval does not clear the ±{100 * c.margin:g} % margin)"
    known = answer.known_faster
    if known is not None:
        return (
            text + f"; {_b('verdict', c.verdict)}{html.escape(why)}; but "
            f"{_b('known-faster', known.experiment)} is known to beat the baseline: "
            f"{known.ratio:.2f}× [{html.escape(bounds_text(known.ci_low, known.ci_high))}], "
            f"faster at 95 % confidence over all {k} candidates)"
        )
    return (
        text + f"; {_b('verdict', c.verdict)}{html.escape(why)}, so no configuration is "
        "known to beat the baseline yet)"
    )


def _verdicts(pairs: pd.DataFrame) -> str:
    """``2 faster, 1 undecided`` over the pairs' comparisons."""
    found = [c.verdict for c in pairs.get("compared", ()) if isinstance(c, Comparison)]
    n = {v: found.count(v) for v in VERDICTS if v in found}
    return ", ".join(f"{k} {v}" for v, k in n.items()) or "no verdict"


def _decided(comparisons: pd.DataFrame | None) -> str:
    """How many of the report's comparisons are decided, and how."""
    if comparisons is None or not len(comparisons):
        return ""
    n = counts(comparisons)
    margin = float(comparisons["margin"].iloc[0])
    total = sum(n.values())
    decided = total - n["undecided"]
    return (
        f"Comparisons: {_b('decided', str(decided))} of {total} decided at 95 % confidence "
        f"({n['faster']} faster, {n['slower']} slower, {n['same']} the same within "
        f"±{100 * margin:g} %), {_b('undecided', str(n['undecided']))} undecided (see How "
        "sure each comparison is; all of them in comparisons.csv)."
    )


def _measured(frame: pd.DataFrame, stats: pd.DataFrame) -> str:
    n = len(frame)
    if not n:
        return "Nothing was measured: no trial records."
    ok = frame["status"] == OK
    timed = pd.to_numeric(frame.loc[ok, "steps_timed"], errors="coerce")
    presets = ", ".join(sorted({str(v) for v in frame["preset"].dropna()})) or "unknown"
    trials = pd.to_numeric(stats["n_trials"], errors="coerce")
    per = (
        f"{int(trials.min())}"
        if trials.min() == trials.max()
        else (f"{int(trials.min())}–{int(trials.max())}")
    )
    _, n_ok, n_failed = trial_counts(frame)
    n_left, n_incorrect = left_out(frame), incorrect(frame)
    wrong = (
        f", {n_incorrect} incorrect (their step failed the gradient check; a configuration's "
        "later trials take its first trial's verdict without running)"
        if n_incorrect
        else ""
    )
    text = (
        f"Measured: {_b('trials', str(n))} trials of {len(stats)} experiments "
        f"({per} per experiment; preset {html.escape(presets)}), {n_ok} ok{wrong}, "
        f"{n_failed} failed"
    )
    if n_left:
        text += f", {n_left} left out by the budget's clock (they run next time)"
    if timed.notna().any():
        text += (
            f"; {_b('steps', f'{int(timed.sum()):,}')} timed steps in all, "
            f"{int(timed.median())} per ok trial (median, {int(timed.min())}–{int(timed.max())})"
        )
        few = int((timed < 10).sum())
        if few:
            text += (
                f". {few} ok trial{'s' if few > 1 else ''} timed fewer than 10 steps: their "
                "step-time percentiles are not shown (p90 needs 10 steps, p95 20, p99 100)"
            )
    else:
        text += "; the number of timed steps is not recorded"
    return text + "."


def left_out_by_plan(plan: Mapping | None) -> tuple[str, str]:
    """What a budget's plan left out before any trial ran (``plan``: ``{"budget",
    "planned", "left_out": [{"id", "group"}]}``, study/entry.py ``plan_budget``): the
    headline's line and the page's list (``id="left-out-by-budget"``); both "" where it
    left out nothing."""
    plan = plan if isinstance(plan, Mapping) else {}  # (JSON that is not an object: none)
    gone = [e for e in plan.get("left_out") or [] if isinstance(e, Mapping)]
    if not gone:
        return "", ""
    groups: dict[str, list[str]] = {}
    for e in gone:
        groups.setdefault(str(e.get("group") or e.get("id")), []).append(str(e.get("id")))
    budget = html.escape(str(plan.get("budget")))
    planned = plan.get("planned")
    of = f" of the study's {planned}" if isinstance(planned, int) else ""
    when = ("by its plan, made again once the calibrations and the question's first trials "
            "had run" if plan.get("replanned") else "before any trial ran")  # fmt: skip
    line = (
        f"The budget ({budget}) left out {_b('budget-left-out', str(len(gone)))}{of} "
        f"experiments {when}, to fit it: "
        f"{html.escape(', '.join(f'{g} ({len(ids)})' for g, ids in groups.items()))} (see "
        '<a href="#left-out-by-budget">Left out by the budget</a>). This report has no '
        "results of theirs; snakemake without the budget, or with a larger one, runs them "
        "and keeps the trials above."
    )
    items = "".join(
        f"<li>{html.escape(g)}: {html.escape(', '.join(ids))}</li>" for g, ids in groups.items()
    )
    page = (
        f'<details class="note" id="left-out-by-budget"><summary>Left out by the budget '
        f"({budget}): {len(gone)}{of} experiments, by group</summary><ul>{items}</ul>"
        "</details>"
    )
    return line, page


#: up to this many cut-short experiments are named in the headline's line itself
FEW_TRUNCATED = 5


def _budget(stats: pd.DataFrame) -> str:
    cut = truncated(stats)
    if not len(cut):
        return "Every experiment ran all the timed steps it asked for." if len(stats) else ""
    rows = [r for _, r in cut.iterrows()]
    names = html.escape(", ".join(f"{r['experiment']} ({steps_text(r)})" for r in rows))
    head = (
        f"{_b('truncated', str(len(cut)))} experiment{'s rest' if len(cut) > 1 else ' rests'} "
        "on fewer timed steps than asked"
    )
    if len(cut) <= FEW_TRUNCATED:
        return f"{head}: {names}."
    # many: the reasons counted, the list folded (it would fill the first screen)
    whys = Counter(cut_reason(r) for r in rows)
    counts = html.escape("; ".join(f"{why}: {n}" for why, n in whys.most_common()))
    return f"{head} ({counts}). <details><summary>Which</summary>{names}.</details>"


def _noise(frame: pd.DataFrame, stats: pd.DataFrame, records: Sequence[Any]) -> str:
    if not len(frame):
        return ""
    noisy = int(frame["noisy"].fillna(False).astype(bool).sum()) if "noisy" in frame else 0
    # the noisy trials of experiments whose noisy trials outnumber the clean ones are used
    used = 0
    if len(stats) and {"n_noisy", "noisy_used"} <= set(stats.columns):
        n = pd.to_numeric(stats["n_noisy"], errors="coerce").fillna(0)
        used = int(n[stats["noisy_used"].fillna(False).astype(bool)].sum())
    discarded = sum(
        len(r.get("discarded_attempts") or [])
        for r in records
        if isinstance(r, Mapping) and isinstance(r.get("discarded_attempts"), list)
    )
    walls = [r for r in records if isinstance(r, Mapping) and finite(r.get("trial_wall_s"))]
    wall = sum(float(r["trial_wall_s"]) for r in walls)
    retried = sum(float(r["retry_wall_s"]) for r in walls if finite(r.get("retry_wall_s")))
    cost = (
        f", {100 * retried / wall:.0f}% of the trials' wall time ({retried / 60:.1f} of "
        f"{wall / 60:.1f} min)"
        if discarded and wall > 0
        else ""
    )
    fate = " and left out of the medians"
    if used:
        fate = (
            f", {noisy - used} left out of the medians, {used} used where an experiment's "
            "noisy trials outnumber its clean ones"
            if used < noisy
            else ", used all the same: in each experiment they outnumber the clean ones"
        )
    withheld = sum(
        1
        for r in records
        if isinstance(r, Mapping)
        and isinstance(r.get("noise_check"), Mapping)
        and r["noise_check"].get("rerun_withheld")
    )
    kept = (
        f"; {withheld} disturbed trial{'s' if withheld != 1 else ''} not rerun, the trial "
        "before ending disturbed after its own reruns (the disturbance outlasted a trial)"
        if withheld
        else ""
    )
    return (
        f"Noise: {_b('noisy', str(noisy))} trial{'s' if noisy != 1 else ''} flagged as "
        f"disturbed{fate}; {discarded} attempt{'s' if discarded != 1 else ''} discarded and "
        f"rerun{cost}{kept} (see Measurement noise)."
    )


def _correctness(check: pd.DataFrame) -> str:
    if check is None or not len(check):
        return "Correctness: no loss curves to compare."
    checked = check[check["verdict"].isin(["matches", "drifts", "diverges"])]
    bad = checked[checked["verdict"] == "diverges"]
    if not len(checked):
        return "Correctness: no configuration has an fp32 eager run of the same setup to compare."
    if len(bad):
        return (
            f"Correctness: {_b('diverging', str(len(bad)))} of {len(checked)} configurations "
            f"diverge from the fp32 eager losses: {html.escape(', '.join(bad['experiment']))}."
        )
    return (
        f"Correctness: all {len(checked)} configurations compared follow the fp32 eager "
        "loss curve of their setup."
    )
