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
* **Log scale, one spread per kin.** Throughputs are compared as ratios, so on the
  log scale. The ratio is of the medians over trials (as everywhere in the report).
  The run-to-run spread ``s`` of a log throughput is pooled (``sum (n_i - 1) s_i^2 /
  sum (n_i - 1)``, ``df = sum (n_i - 1)``) over the experiments with two used trials
  or more of the pair's **kin** (:data:`KIN`: the same model on the same threads,
  ranks and nodes, as both sides of the pair are; their trials vary alike): two
  trials of one experiment say little about its spread, a dozen of its kin say much.
  A kin pooled over fewer than :data:`MIN_KIN_DF` degrees of freedom gives way to the
  pool over every experiment of the run where that one is the wider: one machine's
  quiet kin must not narrow a noisy kin's interval (a 2-thread tiny CNN varied by 10 %
  between processes where ResNet-50's rungs varied by 4 %, on one VM). With no
  experiment of two trials there is no interval, and every verdict is ``undecided``.
* **Interval.** ``ratio · exp(± t(0.975, df) · s · sqrt(1/n_a + 1/n_b))`` (Student's t,
  from scipy; the median of two trials is their mean, and of more, a robust stand-in).
* **Verdict**, against a margin ``m`` (the ``margin`` setting, 3 % by default:
  differences smaller than this are not worth a configuration change; it rides on
  the statistics frame beside the spread, so every comparison of a run uses the
  same one): ``same`` when the whole interval lies within
  ``[1/(1+m), 1+m]``; ``faster`` when it lies above ``1+m``; ``slower`` when below
  ``1/(1+m)``; else ``undecided`` (more trials would tell). Two experiments with
  identical settings come out ``same`` or ``undecided``: ``faster`` would need their
  interval to clear the margin, not merely 1.0.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any

import pandas as pd
from scipy import stats as scipy_stats

from ..study.settings import SETTINGS
from .values import isnan

#: the interval's confidence
CONFIDENCE = 0.95
#: the default margin within which two throughputs count as the same
MARGIN: float = SETTINGS["margin"].default
VERDICTS = ("faster", "slower", "same", "undecided")
#: what makes experiments kin, whose trials vary alike: one spread is pooled over them
KIN = ("model", "threads", "ranks", "nodes")
#: a kin's pool with fewer degrees of freedom gives way to the run's where that is wider
MIN_KIN_DF = 4
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
    #: the spread of log throughput its interval used, and its degrees of freedom
    spread: float = math.nan
    df: int = 0

    def text(self) -> str:
        """``1.12× ([1.08–1.16], faster)``; ``1.07× (undecided: one trial each, no
        interval)``."""
        n = min(self.n_baseline, self.n_experiment)
        return ratio_text(self.ratio, self.ci_low, self.ci_high, self.verdict, self.margin, n)

    def qualifier(self) -> str:
        """The interval and verdict alone: ``[1.08–1.16], faster``."""
        n = min(self.n_baseline, self.n_experiment)
        return qualifier(self.ci_low, self.ci_high, self.verdict, self.margin, n)


COLUMNS = [f.name for f in fields(Comparison) if f.name not in ("margin", "spread", "df")]
COLUMNS += ["confidence", "margin", "df", "spread", "headline"]


@dataclass(frozen=True)
class Spread:
    """The pooled run-to-run spread of log throughput: ``sd`` with ``df`` degrees of
    freedom (NaN and 0 without an experiment of two used trials)."""

    sd: float
    df: int

    @classmethod
    def pooled(cls, samples: Iterable[Sequence[float]]) -> Spread:
        ss, df = 0.0, 0
        for values in samples:
            logs = [math.log(v) for v in values if _positive(v)]
            if len(logs) < 2:
                continue
            mean = sum(logs) / len(logs)
            ss += sum((x - mean) ** 2 for x in logs)
            df += len(logs) - 1
        return cls.of(ss, df)

    @classmethod
    def of(cls, ss: float, df: int) -> Spread:
        """The spread of a sum of squares over ``df`` degrees of freedom."""
        return cls(math.sqrt(ss / df) if df else math.nan, df)

    @property
    def ss(self) -> float:
        """The sum of squares it pools (0 without degrees of freedom)."""
        return self.sd**2 * self.df if self.df else 0.0

    def __add__(self, other: Spread) -> Spread:
        """Two disjoint pools as one."""
        return Spread.of(self.ss + other.ss, self.df + other.df)


def _positive(v: Any) -> bool:
    return not isnan(v) and float(v) > 0


def verdict(ci_low: float, ci_high: float, margin: float = MARGIN) -> str:
    """``same``, ``faster``, ``slower`` or ``undecided`` for an interval of a ratio."""
    if isnan(ci_low) or isnan(ci_high):
        return "undecided"
    top, bottom = 1.0 + margin, 1.0 / (1.0 + margin)
    if ci_low >= bottom and ci_high <= top:
        return "same"
    if ci_low > top:
        return "faster"
    if ci_high < bottom:
        return "slower"
    return "undecided"


def _median(values: Sequence[float]) -> float:
    v = sorted(values)
    mid = len(v) // 2
    return v[mid] if len(v) % 2 else (v[mid - 1] + v[mid]) / 2


def interval(
    a: Sequence[float], b: Sequence[float], spread: Spread, confidence: float = CONFIDENCE
) -> tuple[float, float, float]:
    """The ratio of ``b``'s median over ``a``'s and its interval (NaN where a side has
    no value, or no spread is known)."""
    a = [float(v) for v in a if _positive(v)]
    b = [float(v) for v in b if _positive(v)]
    if not a or not b:
        return math.nan, math.nan, math.nan
    d = math.log(_median(b) / _median(a))
    if not spread.df or isnan(spread.sd):
        return math.exp(d), math.nan, math.nan
    half = float(scipy_stats.t.ppf(0.5 + confidence / 2, spread.df))
    half *= spread.sd * math.sqrt(1 / len(a) + 1 / len(b))
    return math.exp(d), math.exp(d - half), math.exp(d + half)


def qualifier(lo: Any, hi: Any, verdict_: str, margin: float = MARGIN, n: int = 0) -> str:
    """``[1.08–1.16], faster``; ``undecided: one trial each, no interval``."""
    words = VERDICT_WORDS.get(verdict_, verdict_).format(margin=f"{100 * margin:g} %")
    if isnan(lo) or isnan(hi):
        return f"{words}: " + ("one trial each, no interval" if n <= 1 else "no interval")
    return f"[{float(lo):.2f}–{float(hi):.2f}], {words}"


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


def kin_of(row: Mapping) -> str:
    """The kin an experiment's trials vary with (:data:`KIN`), as text."""
    return " · ".join(f"{k} {'' if isnan(row.get(k)) else row.get(k)}" for k in KIN)


def with_spread(stats: pd.DataFrame, margin: float = MARGIN) -> pd.DataFrame:
    """``stats`` with the run's pooled spread (``sps_spread``, ``sps_spread_df``), each
    row's kin (``sps_kin``) and its kin's pooled spread (``sps_kin_spread``,
    ``sps_kin_df``) and the verdicts' margin (``sps_margin``) on every row, so that any
    two rows make a comparison (:func:`between`)."""
    out = stats.copy()
    used = out["sps_used"] if "sps_used" in out else pd.Series([()] * len(out), dtype=object)
    used = [v if isinstance(v, (tuple, list)) else () for v in used]
    spread = Spread.pooled(used)
    out["sps_spread"], out["sps_spread_df"] = spread.sd, spread.df
    kins = [kin_of(r) for _, r in out.iterrows()]
    members: dict[str, list] = {}
    for kin, values in zip(kins, used, strict=True):
        members.setdefault(kin, []).append(values)
    pools = {kin: Spread.pooled(values) for kin, values in members.items()}
    out["sps_kin"] = kins
    out["sps_kin_spread"] = [pools[k].sd for k in kins]
    out["sps_kin_df"] = [pools[k].df for k in kins]
    out["sps_margin"] = margin
    return out


def margin_of(row: Mapping) -> float:
    """The margin of ``row``'s run (:func:`with_spread`; the default without one)."""
    margin = row.get("sps_margin")
    return MARGIN if isnan(margin) else float(margin)


def _spread_at(row: Mapping, sd_column: str, df_column: str) -> Spread:
    sd, df = row.get(sd_column), row.get(df_column)
    if isnan(sd) or isnan(df) or not int(df):
        return Spread(math.nan, 0)
    return Spread(float(sd), int(df))


def spread_of(row: Mapping) -> Spread:
    """The run's pooled spread on ``row`` (:func:`with_spread`)."""
    return _spread_at(row, "sps_spread", "sps_spread_df")


def kin_spread_of(row: Mapping) -> Spread:
    """``row``'s kin's pooled spread (:func:`with_spread`)."""
    return _spread_at(row, "sps_kin_spread", "sps_kin_df")


def pair_spread(base: Mapping, row: Mapping) -> Spread:
    """The spread a comparison of ``row`` over ``base`` uses: their kin's pool (both
    kins' where they differ), or, with fewer than :data:`MIN_KIN_DF` degrees of
    freedom in it, the wider of that and the run's pool."""
    kin = kin_spread_of(row)
    if base.get("sps_kin") != row.get("sps_kin"):
        kin = kin + kin_spread_of(base)
    run = spread_of(row)
    if kin.df >= MIN_KIN_DF or not run.df:
        return kin
    return kin if kin.df and kin.sd > run.sd else run


def _used(row: Mapping) -> list[float]:
    values = row.get("sps_used")
    if not isinstance(values, (tuple, list)):
        # a row without its trials (an older frame): its median as one trial
        values = () if isnan(row.get("sps_median")) else (row.get("sps_median"),)
    return [float(v) for v in values if _positive(v)]


def between(base: Mapping, row: Mapping, kind: str = "", change: str = "") -> Comparison:
    """``row``'s throughput over ``base``'s, with its interval and verdict (against
    ``row``'s run's margin)."""
    a, b = _used(base), _used(row)
    spread = pair_spread(base, row)
    ratio, lo, hi = interval(a, b, spread)
    margin = margin_of(row)
    return Comparison(
        kind, str(base.get("experiment")), str(row.get("experiment")), ratio, lo, hi,
        len(a), len(b), verdict(lo, hi, margin), change, margin, spread.sd, spread.df,
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
    the spread its interval used, and whether the headline states its pair
    (``headline``: those (baseline, experiment) pairs)."""
    rows, seen, stated = [], set(), set(headline)
    for c in found:
        key = (c.kind, c.baseline, c.experiment)
        if key in seen or c.baseline == c.experiment or isnan(c.ratio):
            continue
        seen.add(key)
        # (an accuracy run's time to train is another ratio than the one stated)
        on_top = (c.baseline, c.experiment) in stated and c.kind != "time"
        rows.append({**asdict(c), "confidence": CONFIDENCE, "headline": on_top})
    return pd.DataFrame(rows, columns=COLUMNS)


def counts(frame: pd.DataFrame) -> dict[str, int]:
    """How many distinct pairs (baseline, experiment) came out each verdict."""
    pairs = frame.drop_duplicates(["baseline", "experiment"]) if len(frame) else frame
    return {v: int((pairs["verdict"] == v).sum()) if len(pairs) else 0 for v in VERDICTS}


def method_text(spread: Spread, margin: float = MARGIN) -> str:
    """The method in one sentence, with this run's spread and margin (HTML)."""
    pooled = (
        "pooled over the pair's kin: the experiments of two trials or more of the same "
        f"model on the same threads, ranks and nodes (with fewer than {MIN_KIN_DF} degrees "
        "of freedom there, the wider of that and the pool over the whole run, here "
        f"{100 * spread.sd:.1f} % with {spread.df} degrees of freedom; each pair's spread "
        "is in the table)"
        if spread.df
        else "unknown: no experiment ran two usable trials, so no interval"
    )
    return (
        "Each ratio is of medians over trials (separate processes; the steps "
        f"within a trial are not independent), with its {100 * CONFIDENCE:g} % interval "
        f"from Student's t and the run-to-run spread of log throughput, {pooled}. "
        f"<i>The same</i>: the whole interval lies within ±{100 * margin:g} %; "
        "<i>faster</i> or <i>slower</i>: it lies wholly beyond that margin; "
        "<i>undecided</i>: anything else (more trials would tell)."
    )
