"""Adaptive rounds: another trial only where a comparison is still undecided.

Trials run in rounds (trial 0 of every experiment, then trial 1, ...). Every experiment
runs ``trials`` of them (the minimum). After that, round k runs only the experiments
that a comparison still undecided after round k-1 names, on either side, or a
comparison the headline states (its ``headline`` column) whose interval still reaches
beyond ±the margin: the study's answer is measured until it is known that well. Any
experiment that ran the minimum may be named, also one that sat out a round (its trials
then skip a number: trial k is round k's): a comparison decided at one look may be
undecided at the next, when the other side's new trials move it, and a run may become
the headline's pick after it stopped. The
round report of round k-1 (``results/rounds/<k-1>/comparisons.csv``, a Snakemake
checkpoint) decides, with the report's own intervals and verdicts
(``report/uncertainty.py``). Any other decided comparison (faster, slower or the same
within the margin) needs no more trials; one whose side failed has no figure and is
no comparison. The rounds end at ``max_trials`` or when nothing is left to measure.
What a figure rests on is in the report's comparisons (trials on each side) and its
summary (one row per trial).

Below the minimum, two things stop an experiment sooner. A seed sweep's seeds are its
configuration's replicates (:func:`first_trials`: 3 seeds of 1 trial each make 3 trials).
And an experiment whose first trial stopped timing far slower than its baseline
(``far_stop``: the 95 % interval of its mean step time wholly beyond 1.5x its
baseline's, the first run before it in its group doing the same work, or its one step
beyond 1.5x squared) runs no other trial where it is slower by the factor squared
(:func:`stopped_far`; where the factor lies beyond the verdicts' margin,
:func:`one_trial_when_far`): bf16 where it is emulated, 40x slower, is as certain of
that after one trial as after two, further than a neighbour's load slowed a whole
process on the machines measured (1.85x). One between the factor and its square runs
its trials: its first may be a disturbed process, its second is another draw. (A run
far faster than its baseline runs its trials: it costs less than its baseline, and may
be the headline.) Its other comparisons rest on that one trial, their intervals from
the spread its kin's other experiments measured.

Stopping on the data this way (optional stopping) would make fixed 95 % intervals
optimistic: each round's report is a look (:func:`looks`), and the looks share the
5 % (:func:`spent`), so that all of them together miss at most 5 %.

An undecided comparison asks for another round only while it may still be decided by
the cap (:func:`decidable`): its chance of a verdict at ``max_trials`` each, from the
ratio and spread it measures now and their uncertainty (its predictive power), must
reach ``futility`` (10 % by default). A comparison of two runs 2 % apart with 9 % between
trials will not be "the same" within ±3 % nor faster at 4 trials, and two more rounds of
both sides buy nothing but time. Stopping for futility only ever withholds a verdict, so
the 5 % the looks share still bounds the wrong ones.
"""

from __future__ import annotations

import csv
import math
import statistics
from collections.abc import Iterable, Mapping
from pathlib import Path

from ..util import finite, read_json

#: the verdict that asks for another round
UNDECIDED = "undecided"


def cap(settings: Mapping) -> int:
    """How many trials an experiment may run: ``max_trials`` when it is above
    ``trials``, else ``trials`` (no adaptive rounds). One trial each decides nothing
    (no spread between trials), so ``trials: 1`` means one trial: no adaptive rounds
    either (``--config trials=1`` on the default study halves it, as it always did)."""
    low = int(settings["trials"])
    high = settings.get("max_trials")
    if high is None or low < 2:
        return low
    return max(low, int(high))


def looks(settings: Mapping) -> int:
    """How many rounds' reports may decide a comparison: the one after the minimum's
    trials and one after each adaptive round (report/uncertainty.py spreads the 5 %
    over them)."""
    return cap(settings) - int(settings["trials"]) + 1 if adaptive(settings) else 1


def spent(look: int, looks: int) -> float:
    """The share of the 5 % that look ``look`` (1 to ``looks``) of a comparison spends:
    ``look^2 / sum(j^2)``, strict early and most at the last look, as O'Brien-Fleming's
    boundaries (most comparisons run to the last; the shares sum to 1, so that all the
    looks together miss at most 5 % of the time, whatever stopped a comparison)."""
    looks = max(1, int(looks))
    look = min(max(1, int(look)), looks)
    return look**2 / sum(j**2 for j in range(1, looks + 1))


def verdict(ci_low: float, ci_high: float, margin: float) -> str:
    """``same``, ``faster``, ``slower`` or ``undecided`` for an interval of a ratio
    (report/uncertainty.py states the rule): the same when the whole interval lies
    within ``[1/(1+m), 1+m]``, faster above ``1+m``, slower below ``1/(1+m)``."""
    if math.isnan(ci_low) or math.isnan(ci_high):
        return UNDECIDED
    top, bottom = 1.0 + margin, 1.0 / (1.0 + margin)
    if ci_low >= bottom and ci_high <= top:
        return "same"
    if ci_low > top:
        return "faster"
    if ci_high < bottom:
        return "slower"
    return UNDECIDED


def exp_or_inf(x: float) -> float:
    """``exp(x)``, infinite beyond the float range (an interval of one degree of freedom
    at an early look's confidence reaches e^1000)."""
    return math.exp(x) if x < 700 else math.inf


def adaptive(settings: Mapping) -> bool:
    return cap(settings) > int(settings["trials"])


def first_trials(specs: Iterable[Mapping], trials: int) -> dict[str, int]:
    """Each experiment's trials before any adaptive round: ``trials``, but where a seed
    sweep makes one configuration several experiments (the same settings but the seed),
    ``ceil(trials / seeds)``: the report pools a configuration's seeds (its time to
    train, its accuracy: every trial of every seed, ``report/distributed.py``), so its
    seeds are its replicates, and 3 seeds of one trial each are 3 trials of it."""
    specs = list(specs)

    def configuration(spec: Mapping) -> str:
        return repr(sorted((k, repr(v)) for k, v in spec.items() if k not in ("id", "seed")))

    seeds: dict[str, set] = {}
    for spec in specs:
        if spec.get("seed") is not None:
            seeds.setdefault(configuration(spec), set()).add(spec["seed"])
    out = {}
    for spec in specs:
        n = len(seeds.get(configuration(spec), ())) if spec.get("seed") is not None else 1
        out[str(spec["id"])] = max(1, math.ceil(trials / max(1, n)))
    return out


#: why a trial's timed steps ended when it was far from its baseline (rank/harness.py)
FAR = "far_from_baseline"


def one_trial_when_far(spec: Mapping, margin: float) -> bool:
    """Whether a first trial that stops far from its baseline is the experiment's last:
    where its ``far_stop`` lies beyond the verdicts' margin (1.5x against ±3 %), being
    beyond it settles the comparison; a factor within the margin settles nothing."""
    factor = spec.get("far_stop")
    return bool(factor) and float(factor) > 1 + float(margin)


def far_first(records: Path | str, experiment: str) -> tuple[float, float] | None:
    """How far the first trial of ``experiment`` (``<records>/<id>/trial0.json``, ok)
    stopped from its baseline, where it stopped timing for that (``far_stop``,
    plan/far.py): its median step time over the baseline's (above 1: slower), and the
    factor it was stopped at (NaN where the record does not say); None otherwise."""
    try:
        record = read_json(Path(records) / experiment / "trial0.json", want=None)
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("status") != "ok":
        return None
    metrics = record.get("metrics") or {}
    step = (metrics.get("step_time_s") or {}).get("median")
    far_from = record.get("far_from") or {}
    base = far_from.get("step_time_s")
    if metrics.get("stop_reason") != FAR or not (finite(step) and finite(base) and base > 0):
        return None
    factor = far_from.get("factor")
    return float(step) / float(base), float(factor) if finite(factor) else math.nan


def settles_alone(ratio: float, factor) -> bool:
    """Whether a first trial that stopped far from its baseline at ``ratio`` times its
    step time (``far_stop`` = ``factor``) is the experiment's last: slower by the
    factor squared (:func:`stopped_far`)."""
    return finite(ratio) and finite(factor) and ratio > float(factor) ** 2


def stopped_far(records: Path | str, experiments: Iterable[str]) -> set[str]:
    """The experiments whose first trial stopped timing far slower than its baseline
    by its ``far_stop`` squared (:func:`far_first`; 2.25x at the default 1.5x): that
    one trial decides the comparison its speed was checked against, and it runs no
    other. One that stopped between the factor and its square runs its trials: one
    process is one draw of the machine's state, and a neighbour's load slowed whole
    processes of identical settings by up to 1.85x on the 2-vCPU machines measured
    (twins at 0.54x and 0.64x of their baseline), which no spread between trials
    foretells; its second trial, a round later, is another draw. (A run far faster than
    its baseline runs its trials: it costs less than the baseline, and it may be the
    answer, the headline's fastest configuration.)"""
    out = set()
    for experiment in experiments:
        far = far_first(records, experiment)
        if far is not None and settles_alone(*far):
            out.add(experiment)
    return out


def read_rows(comparisons_csv: Path | str) -> list[dict]:
    """A round report's ``comparisons.csv`` as rows."""
    with open(comparisons_csv, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def _wide_headline(rows: list) -> list[tuple[str, str]]:
    """The (baseline, experiment) pairs that the headline states (``headline``) with an
    interval wider than ±its margin: decided or not, the study's answer is still
    measured until it is known that well (or the cap)."""
    return [
        (r["baseline"], r["experiment"])
        for r in rows
        if str(r.get("headline")).lower() == "true" and _wider_than_margin(r)
    ]


def _wider_than_margin(row: Mapping) -> bool:
    """Whether the interval of a comparisons.csv row reaches beyond ±its margin around
    its ratio, either way (no interval: wider), by the rule of the verdict "the same"
    (report/uncertainty.py: within 1/(1+m) to 1+m), here around the ratio."""
    try:
        ratio, low, high = (float(row[k]) for k in ("ratio", "ci_low", "ci_high"))
        margin = float(row["margin"])
    except (KeyError, TypeError, ValueError):
        return False
    if not (finite(ratio) and ratio > 0 and finite(margin)):
        return False
    if not (finite(low) and finite(high) and low > 0):
        return True
    return max(high / ratio, ratio / low) > 1 + margin


def going_on(
    comparisons_csv: Path | str, ran: Iterable[str], settings: Mapping | None = None,
    round_: int | None = None,
) -> list[str]:  # fmt: skip
    """The experiments of ``ran`` (those that may run another trial: every one that ran
    the minimum, rules/common.smk) that an undecided comparison of that round's
    ``comparisons.csv`` names, one that may still be decided by the cap
    (:func:`decidable`, with the study's ``settings`` and ``round_``, the round whose
    report it is; without them, every undecided one), or a comparison the headline
    states with an interval wider than its margin; in ``ran``'s order."""
    return continuing(read_rows(comparisons_csv), ran, settings, round_)


def continuing(
    rows: Iterable[Mapping], ran: Iterable[str], settings: Mapping | None = None,
    round_: int | None = None,
) -> list[str]:  # fmt: skip
    """:func:`going_on` of a round's comparisons as rows (``comparisons.csv``'s)."""
    rows = list(rows)
    undecided = [r for r in rows if r.get("verdict") == UNDECIDED]
    if settings is not None and round_ is not None:
        undecided = [r for r in undecided if decidable(r, settings, round_)]
    pairs = [(r["baseline"], r["experiment"]) for r in undecided] + _wide_headline(rows)
    named = {e for pair in pairs for e in pair}
    return [e for e in ran if e in named]


def look_of(round_: int, settings: Mapping) -> int:
    """Which look at the comparisons the report of round ``round_`` (0-based: after
    trial ``round_`` of every experiment) is: the first after the minimum's trials
    (a provisional one before it: the first too)."""
    return max(1, int(round_) - int(settings["trials"]) + 2)


def decision_chance(row: Mapping, cap_: int, looks_: int, look: int) -> float:
    """The chance that a comparison (a ``comparisons.csv`` row, at look ``look`` of
    ``looks_``) is decided (faster, slower or the same) at the last look, with ``cap_``
    trials each: its predictive power (Spiegelhalter, Freedman and Blackburn 1986).
    Each side's last mean log throughput is today's ``n`` trials and the ``N - n`` to
    come, whose mean is today's give or take its own error; so the last look's log
    ratio varies around today's with variance ``spread^2 (1/n - 1/N)`` summed over the
    two sides (``spread``: the row's, between trials). Its interval is the last
    look's: the row's confidence with that look's share of the 5 %
    (:func:`spent`), at ``spread sqrt(1/N_a + 1/N_b)``, on the degrees of
    freedom the new trials add. 1 where the row says too little (no spread or degrees
    of freedom: the rounds decide as they did)."""
    import scipy.stats

    try:
        ratio, spread, df = (float(row[k]) for k in ("ratio", "spread", "df"))
        n_a, n_b = (int(float(row[k])) for k in ("n_baseline", "n_experiment"))
        margin, confidence = float(row["margin"]), float(row["confidence"])
    except (KeyError, TypeError, ValueError):
        return 1.0
    if not all(finite(v) for v in (ratio, spread, df, margin, confidence)):
        return 1.0
    if ratio <= 0 or spread <= 0 or df < 1 or n_a < 1 or n_b < 1:
        return 1.0
    big_a, big_b = max(n_a, cap_), max(n_b, cap_)
    alpha = (1 - confidence) * spent(looks_, looks_) / spent(look, looks_)
    df_last = df + (big_a - n_a) + (big_b - n_b)
    half = float(scipy.stats.t.ppf(1 - alpha / 2, df_last)) * spread
    half *= math.sqrt(1 / big_a + 1 / big_b)
    sd = spread * math.sqrt(1 / n_a - 1 / big_a + 1 / n_b - 1 / big_b)
    x, bound = math.log(ratio), math.log1p(margin)
    if sd <= 0:  # no trial to come: decided now or never
        return 0.0
    norm = scipy.stats.norm
    chance = norm.sf((bound + half - x) / sd) + norm.cdf((-bound - half - x) / sd)
    if half < bound:  # "the same" within the margin is within reach
        chance += max(0.0, norm.cdf((bound - half - x) / sd) - norm.cdf((half - bound - x) / sd))
    return float(min(1.0, chance))


def decidable(row: Mapping, settings: Mapping, round_: int) -> bool:
    """Whether an undecided comparison of round ``round_``'s report may still be
    decided by the cap: its :func:`decision_chance` reaches the study's ``futility``
    (0: always)."""
    floor = float(settings.get("futility") or 0.0)
    if floor <= 0:
        return True
    chance = decision_chance(row, cap(settings), looks(settings), look_of(round_, settings))
    return chance >= floor


# ---- a budget the user can give (--config budget=1h) ----

#: the spread of log throughput between trials assumed before a run has measured one
#: (what trials of one configuration varied by on a shared 2-vCPU VM here)
ASSUMED_SPREAD = 0.05


def rounds_within(
    budget_s: float, setup_s: float, first_s: float, round_s: float, low: int, high: int
):
    """The most rounds in ``low``..``high`` whose worst case fits ``budget_s``: the
    minimum's trials (``first_s``), then every experiment that may go on in every
    adaptive round (``round_s`` each); None when not even ``low`` does."""
    spare = budget_s - setup_s - first_s
    if spare < 0:
        return None
    if round_s <= 0:
        return high
    return min(high, low + int(spare // round_s))


def half_width(trials: int, experiments: int, spread: float) -> float:
    """The 95 % interval's half-width (as a factor's log) of a comparison of ``trials``
    each, the spread pooled over ``experiments`` of that many trials."""
    import scipy.stats

    df = experiments * (trials - 1)
    if trials < 2 or df < 1:
        return math.inf
    return float(scipy.stats.t.ppf(0.975, df)) * spread * math.sqrt(2 / trials)


def precision_text(trials: int, experiments: int, spread: float, source: str, margin: float) -> str:
    """What ``trials`` each buys: the interval, the differences it decides, and how many
    trials "the same" within the verdicts' ``margin`` would need."""
    hw = half_width(trials, experiments, spread)
    if not math.isfinite(hw):
        return f"with {trials} trial each nothing is decided (no spread between trials)"
    same = next(
        (n for n in range(2, 1000) if half_width(n, experiments, spread) < math.log(1 + margin)),
        None,
    )
    text = (
        f"with {trials} trials each a comparison's 95 % interval is about "
        f"±{100 * math.expm1(hw):.0f} % (spread between trials {100 * spread:.1f} %, "
        f"{source}), so differences beyond about {100 * ((1 + margin) * math.exp(hw) - 1):.0f} "
        "% come out faster or slower"
    )
    if same:
        text += f"; 'the same' within ±{100 * margin:g} % needs about {same} trials each"
    return text


def measured_spread(comparisons_csv: Path | str) -> float | None:
    """The spread an earlier run's comparisons.csv states (the median of its pairs'
    pooled spreads), if any."""
    values = []
    try:
        with open(comparisons_csv, newline="", encoding="utf-8") as f:
            for row in csv.DictReader(f):
                value = float(row.get("spread") or "nan")
                if math.isfinite(value) and value > 0:
                    values.append(value)
    except (OSError, ValueError):
        return None
    return statistics.median(values) if values else None
