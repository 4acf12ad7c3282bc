"""Which experiments the adaptive rounds will likely run, forecast from the comparisons
so far: the rounds' share of the time left.

While the minimum's trials run, the adaptive rounds after it (``plan/rounds.py``:
another trial only where a comparison is still undecided) could only be counted at
most, every experiment to ``max_trials``: in the default study's whole run on two
AVX-512 CPUs (stop 80) they took 25 of the 96 min that bound said, and the time left
the progress lines gave for the minimum alone was 1.31x to 7.5x short of the truth.

Each comparison of the latest round report (a provisional one's too) is carried
forward to the report that decides round ``k`` (after ``k`` trials each): its log
ratio then varies around today's with variance ``spread^2 (1/n - 1/k)`` summed over
the two sides (the predictive distribution of ``rounds.decision_chance``; a side that
runs no more trials, one stopped far from its baseline, keeps its ``n``). At
:data:`POINTS` quantiles of that distribution, the interval at that report's
confidence (its share of the 5 %, ``rounds.spent``) and the study's own rule
(``rounds.continuing``: undecided and still decidable by the cap, or the headline's
wider than its margin) say whether the pair goes on; the share of points where it
does is the comparison's chance, and an experiment's is the largest of its
comparisons'. A comparison without a spread yet (one trial each) takes the median
spread of those that have one (else ``rounds.ASSUMED_SPREAD``), pooled as a kin's is
(:data:`KIN_DF` degrees of freedom per trial). An experiment that the report could
not name yet (a provisional report covers the headline's group, or each family's
ladder) goes on at the mean chance of those it names, weighed by their trials' time.

Against that run's records (each report as it was written, forecasting the rounds to
come; the experiments' trials at their measured wall): from the headline group's first
report (8 min into the run), 8.3 of its 11 experiments into round 2, where 9 went on,
and 3.7 into round 3, where 6 did; from round 0's (one trial of each, 79 min in), 52
experiments for 24 min into round 2 and 26 for 11 min into round 3, where 42 ran 13 min
and 28 ran 10 min; from round 1's, 28 for 11 min into round 3. The progress lines of
that run, made again from its files as they stood at each line's time, were within
0.75x to 1.19x of the time it then took to finish from the first tenth of its trials
on, 155 of 156 within 1.3x (0.94x to 7.5x before). The earliest reports forecast from
one trial each, with a spread not yet measured: the progress line says it is a
forecast, and gives the bound beside it.
"""

from __future__ import annotations

import functools
import math
import statistics
from collections.abc import Collection, Iterable, Mapping

from . import rounds

#: quantiles of each comparison's predictive distribution that are looked at
POINTS = 9
#: degrees of freedom a pooled spread gains per trial where none is measured yet (a
#: kin pools a few experiments' trials: the default study's round-1 reports pooled
#: 4 to 38 degrees of freedom at 2 trials each)
KIN_DF = 5.0

_Z = [statistics.NormalDist().inv_cdf((i + 0.5) / POINTS) for i in range(POINTS)]


@functools.lru_cache(maxsize=4096)
def _t(p: float, df: float) -> float:
    import scipy.stats

    return float(scipy.stats.t.ppf(p, df))


def _num(row: Mapping, key: str, default: float = math.nan) -> float:
    try:
        value = float(row.get(key))
    except (TypeError, ValueError):
        return default
    return value if math.isfinite(value) else default


def chances(
    rows: Iterable[Mapping], settings: Mapping, round_: int, k: int,
    running: Collection[str] | None = None,
) -> dict[str, float]:  # fmt: skip
    """Each experiment's chance of going on into adaptive round ``k`` (trial ``k + 1``),
    from ``rows`` (a ``comparisons.csv``'s, of round ``round_``'s report; 0 for the
    provisional ones), for the experiments that ``rows`` names. ``running``: those that
    run more trials (a side not in it keeps its trials; None: every side). Where
    round ``round_``'s report is the one that decides round ``k`` (``round_ >= k - 1``)
    the chances are its decisions, 1 or 0."""
    rows = list(rows)
    if round_ >= k - 1:
        named = {r[side] for r in rows for side in ("baseline", "experiment")}
        if running is not None:
            named &= set(running)
        named = sorted(named)
        going = set(rounds.continuing(rows, named, settings, round_))
        return {e: float(e in going) for e in named}
    spreads = [v for r in rows if (v := _num(r, "spread")) > 0]
    fallback = statistics.median(spreads) if spreads else rounds.ASSUMED_SPREAD
    looks = rounds.looks(settings)
    share = rounds.spent(rounds.look_of(k - 1, settings), looks) / rounds.spent(
        rounds.look_of(round_, settings), looks
    )
    out: dict[str, float] = {}
    for row in rows:
        chance = _row_chance(row, settings, round_, k, fallback, share, running)
        for e in (row["baseline"], row["experiment"]):
            out[e] = max(out.get(e, 0.0), chance)
    return out


def _row_chance(
    row: Mapping, settings: Mapping, round_: int, k: int, fallback: float, share: float,
    running: Collection[str] | None,
) -> float:  # fmt: skip
    """The share of a comparison's predicted futures at round ``k - 1``'s report in
    which it sends its pair on to round ``k`` (:func:`chances`)."""
    ratio = _num(row, "ratio")
    if not ratio > 0:  # a side without a figure: no comparison, nothing goes on for it
        return 0.0
    margin = _num(row, "margin", float(settings.get("margin", 0.03)))
    n_a = int(_num(row, "n_baseline", round_ + 1))
    n_b = int(_num(row, "n_experiment", round_ + 1))
    spread, df = _num(row, "spread"), _num(row, "df", 0.0)
    if not spread > 0:
        spread, df = fallback, 0.0
    big_a = max(n_a, k) if running is None or row["baseline"] in running else n_a
    big_b = max(n_b, k) if running is None or row["experiment"] in running else n_b
    alpha = (1.0 - _num(row, "confidence", 0.95)) * share
    df_then = max(df + (big_a - n_a) + (big_b - n_b), KIN_DF * (k - 1), 1.0)
    half = _t(1.0 - alpha / 2.0, round(df_then, 1)) * spread * math.sqrt(1 / big_a + 1 / big_b)
    sd = spread * math.sqrt(max(0.0, 1 / n_a - 1 / big_a + 1 / n_b - 1 / big_b))
    pair = [row["baseline"], row["experiment"]]
    x, hits = math.log(ratio), 0
    points = _Z if sd > 0 else [0.0]
    for z in points:
        y = x + z * sd
        low, high = rounds.exp_or_inf(y - half), rounds.exp_or_inf(y + half)
        future = {
            **row, "ratio": math.exp(y), "ci_low": low, "ci_high": high, "n_baseline": big_a,
            "n_experiment": big_b, "df": df_then, "spread": spread, "margin": margin,
            "confidence": 1.0 - alpha, "verdict": rounds.verdict(low, high, margin),
        }  # fmt: skip
        hits += bool(rounds.continuing([future], pair, settings, k - 1))
    return hits / len(points)


def expected(chance: Mapping[str, float], seconds: Mapping[str, float], complete: bool) -> float:
    """The seconds a round is expected to take: each of its candidates (``seconds``:
    their trial's estimate) at its chance of going on. One the forecast does not name
    goes on at the mean chance of those it does (weighed by their seconds) where the
    report was a provisional one that could not name every experiment yet; where it
    was ``complete`` (a round's, after a trial of every experiment), not at all."""
    named = [e for e in seconds if e in chance]
    weight = sum(seconds[e] for e in named)
    mean = sum(chance[e] * seconds[e] for e in named) / weight if weight > 0 else 0.0
    default = 0.0 if complete else mean
    return sum(chance.get(e, default) * s for e, s in seconds.items())


def runs_at_all(chance: Mapping[str, float], candidates: Iterable[str], complete: bool) -> float:
    """The chance that a round runs at all (one of its ``candidates`` at least goes on,
    each at its chance as :func:`expected` takes it, as if apart): its report's, which
    only a round that runs writes. One it does not name: as in :func:`expected`, the
    mean chance of those it names (unweighed), or none where the report was complete."""
    candidates = list(candidates)
    named = [chance[e] for e in candidates if e in chance]
    default = 0.0 if complete or not named else statistics.fmean(named)
    none = math.prod(1.0 - min(max(chance.get(e, default), 0.0), 1.0) for e in candidates)
    return 1.0 - none
