"""When a noise probe is an outlier among its peers: the rule the trial policy judges a
trial's probes by (``trial/peers.py``, against the trials before it) and the report
judges every trial's by (``summary/records.py``, against all the others), in one
place, below both.

A probe is disturbed when it is below its peers' median by more than their ordinary
spread allows and by at least ``1 - noise_threshold``; with fewer than
:data:`MIN_PEERS` peers, only below :data:`COLD_START` of the level there is. The
reasons and the measurements behind each constant: ``trial/peers.py`` and
docs/measurement.md ("Bounded reruns"). Standard library only.
"""

from __future__ import annotations

import math
import statistics

from .util import finite

#: peers needed before their median is the level a probe is judged against
MIN_PEERS = 4
#: how many robust spreads below the peers' median a probe must be to be an outlier,
#: with a great many peers (an ordinary probe falls there 0.135 % of the time)
OUTLIER_K = 3.0
#: :data:`OUTLIER_K` for n peers, n below :data:`FEW_PEERS`: the spreads below the
#: median of n ordinary (log-normal) peers at which another ordinary probe falls
#: 0.135 % of the time, the median and the spread both taken from the n (Monte Carlo,
#: 4 million draws each: tests/benchmarks/outlier_k.py; tests/test_trial.py checks the
#: rate the rule gives)
FEW_K = {
    4: 30.6, 5: 28.4, 6: 13.0, 7: 12.5, 8: 8.79, 9: 8.53, 10: 6.98, 11: 6.84, 12: 5.97,
    13: 5.92, 14: 5.36, 15: 5.36, 16: 4.97, 17: 4.97, 18: 4.68, 19: 4.68, 20: 4.5,
    21: 4.46, 22: 4.31, 23: 4.3, 24: 4.17, 25: 4.17, 26: 4.09, 27: 4.08, 28: 3.98,
    29: 3.96, 30: 3.89, 31: 3.89,
}  # fmt: skip
#: from this many peers on, ``OUTLIER_K * (1 + MANY_C / n)`` (the same Monte Carlo:
#: c 8.9 at 32 peers, 8.0 at 128; the largest, so the fit never calls more than the tail)
FEW_PEERS = 32
MANY_C = 8.9
#: the least spread taken (log units): a run of near-identical probes must not make a
#: 3 % dip an outlier
SPREAD_FLOOR = 0.02
#: before there are peers: a probe below this share of the calibration was disturbed
COLD_START = 0.5


def ordinary(rates: list[float]) -> dict | None:
    """The ordinary level of a kind of probe (the median) and its robust spread (log
    units: ``raw_spread``, and ``spread``, at least :data:`SPREAD_FLOOR`); None with
    fewer than :data:`MIN_PEERS` rates."""
    rates = [r for r in rates if finite(r) and r > 0]
    if len(rates) < MIN_PEERS:
        return None
    logs = [math.log(r) for r in rates]
    centre = statistics.median(logs)
    raw = 1.4826 * statistics.median(abs(x - centre) for x in logs)
    return {"level": statistics.median(rates), "spread": max(raw, SPREAD_FLOOR),
            "raw_spread": raw, "peers": len(rates)}  # fmt: skip


def outlier_k(peers: int) -> float:
    """How many robust spreads below the median of ``peers`` peers a probe is an
    outlier: :data:`OUTLIER_K` widened for the uncertainty of so few peers' median and
    spread, so that an ordinary probe is called one about as rarely whatever their
    number (:data:`FEW_K`)."""
    if peers < FEW_PEERS:
        return FEW_K[max(peers, MIN_PEERS)]
    return OUTLIER_K * (1 + MANY_C / peers)


def bound(level: dict | None, threshold: float) -> float:
    """The share of the level below which a probe was disturbed: with peers, an outlier
    among them (:func:`outlier_k` of their robust spreads below their median, or
    :data:`OUTLIER_K` of :data:`SPREAD_FLOOR` where they agree more closely than that)
    that is also a drop of at least ``1 - threshold``, and always one below the cold
    start's share; without peers, the cold start's (:data:`COLD_START`, or the setting
    where it is stricter still)."""
    if level is None:
        return min(threshold, COLD_START)
    reach = max(outlier_k(level["peers"]) * level["raw_spread"], OUTLIER_K * SPREAD_FLOOR)
    return min(threshold, max(math.exp(-reach), COLD_START))


def floor(peers: list[float], threshold: float) -> float | None:
    """The rate below which a probe was disturbed, judged against ``peers`` (other
    probes of its kind): their level x :func:`bound`, where they are fewer than
    :data:`MIN_PEERS` their median x the cold start's share; None without any."""
    level = ordinary(peers)
    if level is not None:
        return level["level"] * bound(level, threshold)
    rates = [r for r in peers if finite(r) and r > 0]
    return statistics.median(rates) * bound(None, threshold) if rates else None
