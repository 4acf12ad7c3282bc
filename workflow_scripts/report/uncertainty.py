"""How sure each comparison is: the ratio of two experiments' throughputs with its 95 %
interval and a verdict (faster, slower, the same within a margin, or undecided).

The method, stated once (docs/measurement.md and the report's
"Comparisons" section point here):

* **Trials, not steps.** A figure is an experiment's trials' samples/s, one value per
  trial (a separate process): the used trials of :func:`stats.experiment_stats` (ok,
  with a throughput, the noisy ones left out unless they outnumber the others). Timed
  steps within one process share its placement, its caches and its neighbours: they
  are correlated and make no interval on their own (as pyperf treats the values of one
  worker process).
* **Log scale; the statistic is the one the interval bounds.** Throughputs are compared
  as ratios, so on the log scale: a comparison's ratio is of the two sides' geometric
  means over trials (the mean of log throughput), the statistic whose standard error
  the interval uses. (The tables' per-experiment figures stay medians.)
* **Each side's own noise, borrowing from its like experiments as far as they agree.**
  Each experiment's variance of log throughput is its own trials' (``n - 1`` degrees
  of freedom) moderated towards a prior fitted over its **kin** (:data:`KIN`: the same
  model, mode, precision, threads, ranks, nodes and data pipeline, where trials vary
  alike; a kin of fewer than :data:`MIN_KIN_DF` degrees of freedom borrows from the
  whole run): ``(d0 s0^2 + d s^2) / (d0 + d)`` with ``d0 + d`` degrees of freedom, the
  empirical-Bayes estimate of limma (Smyth 2004). A kin that Bartlett's test does not
  show unlike (:data:`ALIKE`) lends its pool with all its degrees of freedom; else
  ``d0`` is estimated from how much the kin's variances disagree beyond sampling: the
  more (a few noisy members among quiet ones), the smaller ``d0`` and the more each
  experiment's own trials count. An experiment's moderated variance is
  never below its own: a quiet kin does not narrow a noisy experiment.
* **Interval**: Welch's ``ratio · exp(± t(df) · sqrt(v_a/n_a + v_b/n_b))`` (Student's t
  from scipy; Welch-Satterthwaite degrees of freedom, at most what the two sides' data
  and their prior hold).
* **The adaptive rounds' looks.** A comparison may be looked at after each round that
  can stop it (``looks``: ``max_trials - trials + 1``); look ``k`` spends ``k^2 / sum
  j^2`` of the 5 % (:func:`spent`, strict early as O'Brien-Fleming's boundaries), so
  that all the looks together miss at most 5 % whatever stopped a comparison.
* **Verdict**, against a margin ``m`` (the ``margin`` setting, 3 % by default:
  differences smaller than this are not worth a configuration change; it rides on
  the statistics frame beside the spread, so every comparison of a run uses the
  same one): ``same`` when the whole interval lies within
  ``[1/(1+m), 1+m]``; ``faster`` when it lies above ``1+m``; ``slower`` when below
  ``1/(1+m)``; else ``undecided`` (more trials would tell). For two identical
  settings, ``faster`` or ``slower`` needs the interval to miss the truth by more than
  the margin: at most 2.5 % of such comparisons each way (measured:
  tests/benchmarks/verdicts.py).
* **Many comparisons**: each has a p-value for "beyond the margin" (``p_value``, the
  looks counted; below 0.05 exactly when its verdict is faster or slower), and the
  report states how many of the faster or slower verdicts Benjamini-Hochberg keeps at a
  5 % false discovery rate over the whole table (``fdr_kept``).
* **The headline's fastest** is the largest of K candidates: its comparison with the
  baseline uses confidence ``1 - alpha / K`` (``alpha``: what the look spends;
  simultaneous over the candidates), and the runner-up is named beside it where the
  two are not told apart (``report/headline.pick``).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any

import pandas as pd
from scipy import special as scipy_special
from scipy import stats as scipy_stats

from ..plan.rounds import exp_or_inf as _exp
from ..plan.rounds import spent
from ..plan.rounds import verdict as rounds_verdict
from ..spec.settings import SETTINGS
from .values import isnan

#: the interval's confidence
CONFIDENCE = 0.95
#: the default margin within which two throughputs count as the same
MARGIN: float = SETTINGS["margin"].default
VERDICTS = ("faster", "slower", "same", "undecided")
#: what makes experiments kin, whose trials vary alike: each experiment's variance is
#: moderated towards a prior fitted over its kin (the noisier kinds of run, distributed,
#: DataLoader, another precision, have their own)
KIN = ("model", "mode", "precision", "threads", "ranks", "nodes", "data", "num_workers")
#: a kin with fewer degrees of freedom borrows from the whole run instead
MIN_KIN_DF = 4
#: a kin whose variances Bartlett's test does not tell apart at this level lends its
#: pool whole (limma's moment estimate of its spread is for a kin shown unlike: with
#: a few variances of 1 or 2 degrees of freedom, one near zero by chance would make it
#: lend a small prior of few degrees of freedom)
ALIKE = 0.05
#: an experiment whose own variance is beyond its kin's at this level (an F test)
#: borrows nothing from it
UNLIKE = 0.10
#: a verdict's words after a ratio ("1.12× [1.08–1.16], faster")
VERDICT_WORDS = {
    "faster": "faster",
    "slower": "slower",
    "same": "the same within ±{margin}",
    "undecided": "undecided",
}


@dataclass(frozen=True)
class Comparison:
    """One stated comparison: ``experiment`` over ``baseline`` (``ratio`` > 1: faster)."""

    kind: str
    baseline: str
    experiment: str
    ratio: float
    ci_low: float
    ci_high: float
    n_baseline: int
    n_experiment: int
    verdict: str
    change: str = ""
    margin: float = MARGIN
    #: the spread of log throughput its interval used (the root mean of the two sides'
    #: variances), and its degrees of freedom (Welch's)
    spread: float = math.nan
    df: float = 0
    #: the interval's confidence (the looks and the candidates counted)
    confidence: float = CONFIDENCE
    #: the p-value of "beyond the margin" (looks counted): below 1 - CONFIDENCE exactly
    #: when the verdict is faster or slower
    p_value: float = math.nan
    #: what the interval's standard error carries for the sides' trials on different
    #: nodes (the node-to-node spread times their imbalance, :func:`node_term`): 0 where
    #: each side's trials lie on the same nodes in the same shares (one machine)
    node_spread: float = 0.0

    def text(self) -> str:
        """``1.12× ([1.08–1.16], faster)``; ``1.07× (undecided: one trial each, no
        interval)``."""
        n = min(self.n_baseline, self.n_experiment)
        return ratio_text(self.ratio, self.ci_low, self.ci_high, self.verdict, self.margin, n)

    def qualifier(self, picked_of: int = 1) -> str:
        """The interval and verdict alone: ``[1.08–1.16], faster``; ``[1.02–1.22; the
        fastest of 5], faster`` for a run picked as the fastest of ``picked_of`` (its
        interval then simultaneous over them: :func:`between`'s ``candidates``)."""
        n = min(self.n_baseline, self.n_experiment)
        return qualifier(self.ci_low, self.ci_high, self.verdict, self.margin, n, picked_of)


_LATER = ("margin", "spread", "df", "confidence", "p_value", "node_spread")
COLUMNS = [f.name for f in fields(Comparison) if f.name not in _LATER]
COLUMNS += ["confidence", "margin", "df", "spread", "headline", "p_value", "fdr_kept"]
COLUMNS += ["node_spread"]


@dataclass(frozen=True)
class Spread:
    """The pooled run-to-run spread of log throughput: ``sd`` with ``df`` degrees of
    freedom (NaN and 0 without an experiment of two used trials)."""

    sd: float
    df: int

    @classmethod
    def pooled(cls, samples: Iterable[Sequence[float]]) -> Spread:
        return cls.of([_own(values) for values in samples])

    @classmethod
    def of(cls, owns: Sequence[tuple[float, int]]) -> Spread:
        """The pool of experiments' own variances with their degrees of freedom."""
        ss = sum(var * df for var, df in owns if df)
        df = sum(df for _, df in owns)
        return cls(math.sqrt(ss / df) if df else math.nan, df)


def _positive(v: Any) -> bool:
    """A throughput (or a variance) that counts: finite and above zero."""
    return not isnan(v) and math.isfinite(float(v)) and float(v) > 0


def verdict(ci_low: float, ci_high: float, margin: float = MARGIN) -> str:
    """``same``, ``faster``, ``slower`` or ``undecided`` for an interval of a ratio
    (``plan/rounds.verdict``, which the rounds' forecast uses too)."""
    if isnan(ci_low) or isnan(ci_high):
        return "undecided"
    return rounds_verdict(float(ci_low), float(ci_high), margin)


def _log_mean(values: Sequence[float]) -> float:
    return sum(math.log(v) for v in values) / len(values)


def interval(
    a: Sequence[float], b: Sequence[float], spread: Spread, confidence: float = CONFIDENCE
) -> tuple[float, float, float]:
    """The ratio of ``b``'s geometric mean over ``a``'s and its interval from one
    ``spread`` for both sides (NaN where a side has no value, or no spread is known)."""
    a = [float(v) for v in a if _positive(v)]
    b = [float(v) for v in b if _positive(v)]
    if not a or not b:
        return math.nan, math.nan, math.nan
    d = _log_mean(b) - _log_mean(a)
    if not spread.df or isnan(spread.sd):
        return math.exp(d), math.nan, math.nan
    half = float(scipy_stats.t.ppf(0.5 + confidence / 2, spread.df))
    half *= spread.sd * math.sqrt(1 / len(a) + 1 / len(b))
    return math.exp(d), _exp(d - half), _exp(d + half)


def qualifier(
    lo: Any, hi: Any, verdict_: str, margin: float = MARGIN, n: int = 0, picked_of: int = 1
) -> str:
    """``[1.08–1.16], faster``; ``undecided: one trial each, no interval``; ``[1.02–1.22;
    the fastest of 5], faster`` where the run was picked as the fastest of ``picked_of``."""
    words = VERDICT_WORDS.get(verdict_, verdict_).format(margin=f"{100 * margin:g} %")
    if isnan(lo) or isnan(hi):
        return f"{words}: " + ("one trial each, no interval" if n <= 1 else "no interval")
    of = f"; the fastest of {picked_of}" if picked_of > 1 else ""
    return f"[{bounds_text(lo, hi)}{of}], {words}"


#: beyond these, an interval's bound is shown as "<0.01" or ">99" (one trial against two,
#: at a selection's confidence, reaches 10^5: no figure there says more than "wide")
SHOWN = (0.01, 99.0)


def bounds_text(lo: Any, hi: Any) -> str:
    """``1.08–1.16``; ``<0.01–>99`` for an interval too wide to state."""
    low = f"<{SHOWN[0]:g}" if float(lo) < SHOWN[0] else f"{float(lo):.2f}"
    high = f">{SHOWN[1]:g}" if float(hi) > SHOWN[1] else f"{float(hi):.2f}"
    return f"{low}–{high}"


def ratio_text(
    ratio: Any, lo: Any, hi: Any, verdict_: str, margin: float = MARGIN, n: int = 0
) -> str:
    """``1.12× ([1.08–1.16], faster)``; ``1.07× (undecided: one trial each, no
    interval)``."""
    if isnan(ratio):
        return ""
    return f"{float(ratio):.2f}× ({qualifier(lo, hi, verdict_, margin, n)})"


def compared_cell(row: Mapping, column: str, ratio_column: str) -> str:
    """A table cell: ``row[column]``'s comparison with its interval and verdict, or the
    bare ratio ``row[ratio_column]`` where there is none ("" without either)."""
    c = row.get(column)
    if isinstance(c, Comparison) and not isnan(c.ratio):
        return c.text()
    ratio = row.get(ratio_column)
    return "" if isnan(ratio) else f"{float(ratio):.2f}×"


def _kins(stats: pd.DataFrame) -> list[str]:
    """The kin each row's trials vary with (:data:`KIN`), as text."""
    columns = [stats[k] if k in stats else [None] * len(stats) for k in KIN]
    return [
        " · ".join(f"{k} {'' if isnan(v) else v}" for k, v in zip(KIN, values, strict=True))
        for values in zip(*columns, strict=True)
    ]


# ---- each experiment's own variance, moderated towards its kin's (limma's method) ----


def _own(values: Sequence[float]) -> tuple[float, int]:
    """The sample variance of the logs and its degrees of freedom (NaN, 0 below two)."""
    logs = [math.log(v) for v in values if _positive(v)]
    if len(logs) < 2:
        return math.nan, 0
    mean = sum(logs) / len(logs)
    return sum((x - mean) ** 2 for x in logs) / (len(logs) - 1), len(logs) - 1


def bartlett(owns: Sequence[tuple[float, int]]) -> float:
    """Bartlett's test that sample variances ``(variance, degrees of freedom)`` share one
    variance: its p-value (chi-square, ``len(owns) - 1`` degrees of freedom)."""
    total = sum(d for _, d in owns)
    pooled = sum(v * d for v, d in owns) / total
    statistic = total * math.log(pooled) - sum(d * math.log(v) for v, d in owns)
    scale = 1 + (sum(1 / d for _, d in owns) - 1 / total) / (3 * (len(owns) - 1))
    return float(scipy_stats.chi2.sf(statistic / scale, len(owns) - 1))


def _trigamma_inverse(x: float) -> float:
    """``y`` with ``trigamma(y) = x`` (Newton's method, as limma's trigammaInverse)."""
    if x > 1e7:
        return 1 / math.sqrt(x)
    if x < 1e-6:
        return 1 / x
    y = 0.5 + 1 / x
    for _ in range(50):
        tri = float(scipy_special.polygamma(1, y))
        step = tri * (1 - tri / x) / float(scipy_special.polygamma(2, y))
        y += step
        if -step / y < 1e-8:
            break
    return y


@dataclass(frozen=True)
class Prior:
    """The prior of a kin's variances of log throughput: ``var`` with ``df`` degrees of
    freedom (0: none, nothing to borrow)."""

    var: float
    df: float

    @classmethod
    def fitted(cls, owns: Iterable[tuple[float, int]]) -> Prior:
        """The prior of sample variances with their degrees of freedom: their pool with all
        its degrees of freedom unless Bartlett's test shows them unlike (:data:`ALIKE`);
        then by the method of moments on their logs (limma's fitFDist, Smyth 2004): the
        more they disagree beyond what sampling explains, the fewer degrees of freedom
        the prior carries."""
        owns = [(v, d) for v, d in owns if d > 0 and _positive(v)]
        total = sum(d for _, d in owns)
        if not owns:
            return cls(math.nan, 0)
        pooled = sum(v * d for v, d in owns) / total
        # too few to tell how much they disagree, or not shown unlike: their pool
        if len(owns) < 3 or bartlett(owns) >= ALIKE:
            return cls(pooled, total)
        e = [math.log(v) - float(scipy_special.digamma(d / 2)) + math.log(d / 2) for v, d in owns]
        mean = sum(e) / len(e)
        spread = sum((x - mean) ** 2 for x in e) / (len(e) - 1)
        spread -= sum(float(scipy_special.polygamma(1, d / 2)) for _, d in owns) / len(owns)
        if spread <= 0:
            return cls(pooled, total)
        d0 = 2 * _trigamma_inverse(spread)
        if d0 >= total:
            return cls(pooled, total)
        return cls(math.exp(mean + float(scipy_special.digamma(d0 / 2)) - math.log(d0 / 2)), d0)

    def moderated(self, var: float, df: int) -> tuple[float, float]:
        """An experiment's variance ``var`` of ``df`` degrees of freedom moderated
        towards this prior, never below its own, and its degrees of freedom; its own
        alone where it is noisier than the prior beyond chance (an F test at
        :data:`UNLIKE`: its kin is no evidence of its noise)."""
        if not self.df:
            return (var, df) if df else (math.nan, 0)
        if not df:
            return self.var, self.df
        if var / self.var > float(scipy_special.fdtri(df, self.df, 1 - UNLIKE)):
            return var, df
        both = (self.df * self.var + df * var) / (self.df + df)
        return max(both, var), self.df + df


def with_spread(
    stats: pd.DataFrame, margin: float = MARGIN, looks: int = 1, look: int | None = None
) -> pd.DataFrame:
    """``stats`` with each row's moderated variance of log throughput (``sps_var``, its
    degrees of freedom ``sps_var_df``, its prior's ``sps_prior_df``), the run's pooled
    spread (``sps_spread``, ``sps_spread_df``), each row's kin (``sps_kin``), the group
    its prior was fitted on and that group's degrees of freedom (``sps_group``,
    ``sps_group_df``), the verdicts' margin
    (``sps_margin``), the looks at each comparison (``sps_looks``) and what this look
    (default: the last) spends of the 5 % (``sps_alpha``, :func:`spent`) on every row,
    so that any two rows make a comparison (:func:`between`)."""
    out = stats.copy()
    used = out["sps_used"] if "sps_used" in out else pd.Series([()] * len(out), dtype=object)
    used = [v if isinstance(v, (tuple, list)) else () for v in used]
    kins = _kins(out)
    owns = [_own(v) for v in used]
    spread = Spread.of(owns)
    out["sps_spread"], out["sps_spread_df"] = spread.sd, spread.df
    members: dict[str, list[int]] = {}
    for i, kin in enumerate(kins):
        members.setdefault(kin, []).append(i)
    pools = {kin: Spread.of([owns[i] for i in rows]) for kin, rows in members.items()}
    run_prior = Prior.fitted(owns)
    priors, groups = {}, {}
    for kin, rows in members.items():
        groups[kin] = (kin, pools[kin].df)
        if pools[kin].df >= MIN_KIN_DF:
            priors[kin] = Prior.fitted([owns[i] for i in rows])
            continue
        groups[kin] = ("(the run)", spread.df)
        if pools[kin].df and pools[kin].sd ** 2 > run_prior.var:
            # a thin kin noisier than the run: the run's degrees of freedom, its variance
            priors[kin] = Prior(pools[kin].sd ** 2, run_prior.df)
        else:
            priors[kin] = run_prior
    moderated = [priors[k].moderated(*own) for k, own in zip(kins, owns, strict=True)]
    out["sps_kin"] = kins
    out["sps_var"] = [v for v, _ in moderated]
    out["sps_var_df"] = [d for _, d in moderated]
    out["sps_prior_df"] = [priors[k].df for k in kins]
    # where the prior was fitted, and the degrees of freedom all its data hold
    out["sps_group"] = [groups[k][0] for k in kins]
    out["sps_group_df"] = [groups[k][1] for k in kins]
    nodes = out["sps_nodes"] if "sps_nodes" in out else pd.Series([()] * len(out), dtype=object)
    nodes = [v if isinstance(v, (tuple, list)) else () for v in nodes]
    node = node_spread(used, nodes, spread)
    out["sps_node_var"], out["sps_node_df"] = node.sd**2, node.df
    out["sps_margin"] = margin
    out["sps_looks"] = max(1, int(looks))
    out["sps_alpha"] = (1 - CONFIDENCE) * spent(looks if look is None else look, looks)
    return out


def margin_of(row: Mapping) -> float:
    """The margin of ``row``'s run (:func:`with_spread`; the default without one)."""
    margin = row.get("sps_margin")
    return MARGIN if isnan(margin) else float(margin)


def looks_of(row: Mapping) -> int:
    """How many times ``row``'s run looks at a comparison (:func:`with_spread`; 1
    without)."""
    looks = row.get("sps_looks")
    return 1 if isnan(looks) else max(1, int(looks))


def alpha_of(row: Mapping) -> float:
    """What this look of ``row``'s run spends of the 5 % (:func:`with_spread`; all of
    it without)."""
    alpha = row.get("sps_alpha")
    return 1 - CONFIDENCE if isnan(alpha) else float(alpha)


def spread_of(row: Mapping) -> Spread:
    """The run's pooled spread on ``row`` (:func:`with_spread`)."""
    sd, df = row.get("sps_spread"), row.get("sps_spread_df")
    if isnan(sd) or isnan(df) or not int(df):
        return Spread(math.nan, 0)
    return Spread(float(sd), int(df))


def node_spread_of(row: Mapping) -> Spread:
    """The run's node-to-node spread on ``row`` (:func:`with_spread`; 0 df on one node)."""
    var, df = row.get("sps_node_var"), row.get("sps_node_df")
    if isnan(var) or isnan(df) or not int(df):
        return Spread(math.nan, 0)
    return Spread(math.sqrt(float(var)), int(df))


def variance_of(row: Mapping) -> tuple[float, float]:
    """``row``'s moderated variance of log throughput and its degrees of freedom
    (:func:`with_spread`; NaN, 0 without)."""
    var, df = row.get("sps_var"), row.get("sps_var_df")
    if isnan(var) or isnan(df) or not float(df):
        return math.nan, 0
    return float(var), float(df)


def geo_mean(row: Mapping) -> float:
    """The geometric mean of a stats row's used trials' throughput (its median where it
    lists no trials): the statistic every ratio here rests on."""
    values = _used(row)
    return math.exp(_log_mean(values)) if values else math.nan


def _used(row: Mapping) -> list[float]:
    values = row.get("sps_used")
    if not isinstance(values, (tuple, list)):
        # a row without its trials (an older frame): its median as one trial
        values = () if isnan(row.get("sps_median")) else (row.get("sps_median"),)
    return [float(v) for v in values if _positive(v)]


def node_spread(used: list, nodes: list, fallback: Spread) -> Spread:
    """The spread of log throughput from node to node, from every experiment's trials
    (``used``) and the nodes they ran on (``nodes``, aligned): each node's effect fitted
    with the experiments' means (log throughput = experiment + node + noise, by
    alternating means), their standard deviation over the nodes on nodes - 1 degrees
    of freedom (noise in each node's mean counted in it: wider, never narrower). None
    from one node (0, 0); where no experiment has trials on two nodes the node effects
    cannot be told from the experiments', and the run's pooled spread between trials
    (``fallback``) stands in for them."""
    trials = [
        [(math.log(float(v)), str(n)) for v, n in zip(u, ns, strict=False) if _positive(v) and n]
        for u, ns in zip(used, nodes, strict=True)
    ]
    names = sorted({n for t in trials for _, n in t})
    if len(names) < 2:
        return Spread(0.0, 0)
    if not any(len({n for _, n in t}) > 1 for t in trials):
        return fallback
    effect = dict.fromkeys(names, 0.0)
    for _ in range(NODE_ROUNDS):
        means = [statistics.fmean(x - effect[n] for x, n in t) if t else 0.0 for t in trials]
        residual: dict[str, list[float]] = {n: [] for n in names}
        for t, mean in zip(trials, means, strict=True):
            for x, n in t:
                residual[n].append(x - mean)
        effect = {n: statistics.fmean(r) if r else 0.0 for n, r in residual.items()}
        centre = statistics.fmean(effect.values())
        effect = {n: e - centre for n, e in effect.items()}
    return Spread(statistics.stdev(effect.values()), len(names) - 1)


#: rounds of alternating means that fit the node effects (:func:`node_spread`)
NODE_ROUNDS = 25


def node_term(base: Mapping, row: Mapping) -> tuple[float, float]:
    """The variance the node effects add to ``row``'s mean log throughput less
    ``base``'s, and its degrees of freedom: the run's node-to-node variance times the
    sum of squared differences of the two sides' shares of trials on each node (0 where
    each side ran on the same nodes in the same shares, 2 where each ran on one node of
    its own). 0, 0 without the nodes of both sides."""
    var, df = row.get("sps_node_var"), row.get("sps_node_df")
    if isnan(var) or isnan(df) or not float(df) or not float(var):
        return 0.0, 0
    shares = []
    for side in (base, row):
        nodes = side.get("sps_nodes")
        used = side.get("sps_used")
        if not isinstance(nodes, (tuple, list)) or not isinstance(used, (tuple, list)):
            return 0.0, 0
        on = [str(n) for v, n in zip(used, nodes, strict=False) if _positive(v) and n]
        if not on:
            return 0.0, 0
        shares.append({n: on.count(n) / len(on) for n in set(on)})
    a, b = shares
    imbalance = sum((a.get(n, 0.0) - b.get(n, 0.0)) ** 2 for n in set(a) | set(b))
    return float(var) * imbalance, float(df)


def welch(base: Mapping, row: Mapping) -> tuple[float, float]:
    """The standard error of ``row``'s mean log throughput less ``base``'s, and its
    Welch-Satterthwaite degrees of freedom (NaN, 0 where a side has no variance), at
    most what the data of the groups their priors were fitted on hold; with the
    node-to-node variance where the sides' trials lie on different nodes
    (:func:`node_term`, its degrees of freedom in Welch's sum)."""
    (va, da), (vb, db) = variance_of(base), variance_of(row)
    na, nb = len(_used(base)), len(_used(row))
    if not (da and db and na and nb):
        return math.nan, 0
    qa, qb = va / na, vb / nb
    qn, dn = node_term(base, row)
    se2 = qa + qb + qn
    if se2 <= 0:
        return 0.0, da + db
    df = se2**2 / (qa**2 / da + qb**2 / db + (qn**2 / dn if dn else 0.0))
    held = {r.get("sps_group"): r.get("sps_group_df") for r in (base, row)}
    held = [float(v) for v in held.values() if not isnan(v)]
    if held and sum(held) > 0:
        df = min(df, sum(held) + dn)
    return math.sqrt(se2), df


def between(
    base: Mapping, row: Mapping, kind: str = "", change: str = "", candidates: int = 1
) -> Comparison:
    """``row``'s throughput over ``base``'s, with its interval and verdict (against
    ``row``'s run's margin, at confidence ``1 - alpha / candidates``: ``alpha``, what
    this look spends, :func:`spent`; ``candidates``, how many experiments ``row`` was
    picked as the fastest of)."""
    a, b = _used(base), _used(row)
    margin = margin_of(row)
    confidence = 1 - alpha_of(row) / max(1, int(candidates))
    if not a or not b:
        ratio = lo = hi = p = math.nan
        se, df = math.nan, 0
    else:
        d = _log_mean(b) - _log_mean(a)
        ratio, lo, hi, p = math.exp(d), math.nan, math.nan, math.nan
        se, df = welch(base, row)
        if df and not isnan(se):
            # (scipy's t quantile and tail as its ufuncs: the simulation calls them often)
            half = float(scipy_special.stdtrit(df, 0.5 + confidence / 2)) * se
            lo, hi = _exp(d - half), _exp(d + half)
            beyond = abs(d) - math.log1p(margin)
            tail = (
                0.5
                if se == 0 and beyond == 0
                else float(
                    scipy_special.stdtr(
                        df, -beyond / se if se else -math.copysign(math.inf, beyond)
                    )
                )
            )
            p = min(1.0, 2 * tail * (1 - CONFIDENCE) / (1 - confidence))
    spread = math.sqrt(se**2 / (1 / len(a) + 1 / len(b))) if a and b and df else math.nan
    node = math.sqrt(node_term(base, row)[0]) if a and b else 0.0
    return Comparison(
        kind, str(base.get("experiment")), str(row.get("experiment")), ratio, lo, hi,
        len(a), len(b), verdict(lo, hi, margin), change, margin, spread, round(df, 1),
        confidence, p, node,
    )  # fmt: skip


def compared_text(base: Mapping | None, row: Mapping) -> str:
    """``1.12× ([1.08–1.16], faster)`` for ``row`` over ``base`` ("" without both)."""
    if base is None:
        return ""
    return between(base, row).text()


def comparisons_frame(
    found: Iterable[Comparison], headline: Iterable[tuple[str, str]] = ()
) -> pd.DataFrame:
    """``comparisons.csv``: one row per distinct (kind, baseline, experiment), each with
    the spread its interval used, whether the headline states its pair (``headline``:
    those (baseline, experiment) pairs), and whether Benjamini-Hochberg keeps its
    faster or slower verdict at a 5 % false discovery rate over the table
    (``fdr_kept``, :func:`fdr_kept`)."""
    rows, seen, stated = [], set(), set(headline)
    for c in found:
        key = (c.kind, c.baseline, c.experiment)
        if key in seen or c.baseline == c.experiment or isnan(c.ratio):
            continue
        seen.add(key)
        # (an accuracy run's time to train is another ratio than the one stated)
        on_top = (c.baseline, c.experiment) in stated and c.kind != "time"
        rows.append({**asdict(c), "headline": on_top})
    frame = pd.DataFrame(rows, columns=COLUMNS)
    frame["fdr_kept"] = fdr_kept(frame)
    return frame


def fdr_kept(frame: pd.DataFrame, rate: float = 1 - CONFIDENCE) -> list[bool]:
    """Which rows' faster or slower verdicts Benjamini-Hochberg keeps at false discovery
    ``rate`` over the table's distinct pairs (their ``p_value``; a pair stated twice
    counts once, a row without a p-value is kept by none)."""
    if not len(frame):
        return []
    p = pd.to_numeric(frame["p_value"], errors="coerce")
    pair = list(zip(frame["baseline"], frame["experiment"], strict=True))
    first: dict[tuple, float] = {}
    for key, value in zip(pair, p, strict=True):
        if not isnan(value):
            first.setdefault(key, float(value))
    ranked = sorted(first.values())
    m = len(ranked)
    cut = max((k for k in range(1, m + 1) if ranked[k - 1] <= k / m * rate), default=0)
    bound = ranked[cut - 1] if cut else -1.0
    decided = frame["verdict"].isin(["faster", "slower"])
    return [bool(d) and not isnan(v) and float(v) <= bound for d, v in zip(decided, p, strict=True)]


def counts(frame: pd.DataFrame) -> dict[str, int]:
    """How many distinct pairs (baseline, experiment) came out each verdict."""
    pairs = frame.drop_duplicates(["baseline", "experiment"]) if len(frame) else frame
    return {v: int((pairs["verdict"] == v).sum()) if len(pairs) else 0 for v in VERDICTS}


def method_text(
    spread: Spread,
    margin: float = MARGIN,
    looks: int = 1,
    alpha: float = 0.05,
    nodes: Spread | None = None,
) -> str:
    """The method in a few sentences, with this run's spread, margin, looks and, from
    trials on several nodes, its node-to-node spread (``nodes``) (HTML)."""
    pooled = (
        "each side's own variance of log throughput moderated towards its kin's (the "
        "experiments of the same model, mode, precision, threads, ranks, nodes and data "
        f"pipeline; with fewer than {MIN_KIN_DF} degrees of freedom there, the whole "
        "run's), as far as the kin's variances agree, and never below the side's own "
        f"(the run's pooled spread: {100 * spread.sd:.1f} % with {spread.df} "
        f"degree{'s' if spread.df != 1 else ''} of freedom; each pair's is in the table)"
        if spread.df
        else "unknown: no experiment ran two usable trials, so no interval"
    )
    looked = (
        f"; each comparison may be looked at after {looks} rounds, which share the "
        f"{100 * (1 - CONFIDENCE):g} % between them (this report's intervals are at "
        f"{100 * (1 - alpha):.4g} %), so that all looks together miss at most "
        f"{100 * (1 - CONFIDENCE):g} % of the time"
        if looks > 1
        else ""
    )
    noded = (
        f". The trials ran on several nodes, {100 * nodes.sd:.1f} % apart from node to node "
        f"({nodes.df} degree{'s' if nodes.df != 1 else ''} of freedom): where a pair's "
        "sides ran on different nodes, or in different shares, its interval carries that "
        "spread too (the table's node spread)"
        if nodes is not None and nodes.df and not isnan(nodes.sd)
        else ""
    )
    return (
        "Each ratio is of geometric means over trials (separate processes; the steps "
        f"within a trial are not independent), with its {100 * CONFIDENCE:g} % interval "
        f"from Welch's t and {pooled}{looked}{noded}. "
        f"<i>The same</i>: the whole interval lies within ±{100 * margin:g} %; "
        "<i>faster</i> or <i>slower</i>: it lies wholly beyond that margin; "
        "<i>undecided</i>: anything else (more trials would tell"
        + (
            "; the adaptive rounds stop asking for them once the trials left to the cap "
            "are unlikely to decide it: the study's <code>futility</code>)."
            if looks > 1
            else ")."
        )
    )
