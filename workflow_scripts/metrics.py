"""Summary statistics of a step-time distribution (standard library only)."""

from __future__ import annotations

import math
import statistics


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default method), q in [0, 100]."""
    if not values:
        return math.nan
    xs = sorted(values)
    if len(xs) == 1:
        return xs[0]
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def distribution(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    return {
        "mean": statistics.fmean(values),
        "median": percentile(values, 50),
        "p90": percentile(values, 90),
        "p95": percentile(values, 95),
        "p99": percentile(values, 99),
        "stdev": statistics.stdev(values) if len(values) > 1 else 0.0,
        "min": min(values),
        "max": max(values),
    }


def throughput(samples_per_step: int, step_times: list[float]) -> float:
    """Samples per second over the timed steps (total samples / total time, as the article)."""
    total = sum(step_times)
    return samples_per_step * len(step_times) / total if total > 0 else math.nan


#: the fewest timed steps a precision stop looks at (a spread needs a few)
MIN_PRECISION_STEPS = 3
#: the fewest a far stop's interval looks at: two give one (Student's t at 1 df, 12.7,
#: makes it wide unless the steps agree), and a rung 20x from its baseline needs no third
#: step to show it. One step has no interval: it stops a run only when slower than its
#: baseline by the factor squared (bf16 where it is emulated: 40x slower on 2 AVX2
#: cores, a BERT-base step ~8 min); a run faster than its baseline costs less than it
MIN_FAR_STEPS = 2
#: Student's t at 97.5 % (a two-sided 95 % interval) for 1-30 degrees of freedom; beyond,
#: the normal's 1.96 is within 2 % (standard library only: no scipy in a rank's process)
T_975 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip


def relative_half_width(values: list[float]) -> float:
    """The half-width of the 95 % interval of the mean of ``values`` (Student's t), as a
    fraction of the mean: how well one trial knows its own mean step time (NaN with
    fewer than two values). It treats the steps as independent, which they are not
    quite: it says when a trial has timed enough, never how sure a comparison is (that
    comes from the trials: workflow_scripts/report/uncertainty.py)."""
    if len(values) < 2:
        return math.nan
    mean = statistics.fmean(values)
    if mean <= 0:
        return math.nan
    return t_975(len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values)) / mean


def t_975(df: int) -> float:
    """Student's t at 97.5 % for ``df`` degrees of freedom (1 or more)."""
    return T_975[df - 1] if df <= len(T_975) else 1.96


def known_within(values: list[float], precision: float | None) -> bool:
    """Enough timed steps: at least :data:`MIN_PRECISION_STEPS`, their mean known within
    ``precision`` (a fraction; None or 0: never)."""
    if not precision or len(values) < MIN_PRECISION_STEPS:
        return False
    return relative_half_width(values) <= precision


def far_beyond(far: dict | None, step_times: list[float]) -> bool:
    """Whether the 95 % interval of the mean of ``step_times`` (2 at least) puts the
    speedup over ``far``'s baseline (``step_time_s``: its median step) wholly beyond
    ``factor`` either way (``plan/far.py``); or, from one step, whether that step is
    slower than the baseline's by ``factor`` squared."""
    if not far or not step_times:
        return False
    if len(step_times) < MIN_FAR_STEPS:
        return step_times[0] > float(far["step_time_s"]) * float(far["factor"]) ** 2
    mean, half = statistics.fmean(step_times), relative_half_width(step_times)
    if not math.isfinite(half) or mean <= 0:
        return False
    ref, factor = float(far["step_time_s"]), float(far["factor"])
    slowest = ref / (mean * (1 + half))
    fastest = ref / (mean * (1 - half)) if half < 1 else math.inf
    return slowest > factor or fastest < 1 / factor
