"""The reach of an outlier among few peers: ``peers.FEW_K`` and ``peers.MANY_C``.

A probe is an outlier among n peers (workflow_scripts/trial/peers.py) when it is more
than k robust spreads (1.4826 x the median absolute deviation of the log rates) below
their median. With many peers, k = 3 calls an ordinary probe an outlier 0.135 % of the
time (the normal tail). With few, their median and spread are estimates themselves,
and 3 calls it far more often. For each n this finds, by Monte Carlo over normal log
rates, the k at which an ordinary probe falls below 0.135 % of the time, and prints the
table and the fit ``3 * (1 + c / n)`` of the larger n (its largest c, so that the fit
never calls more than the tail).

    python tests/benchmarks/outlier_k.py [--draws 4000000] [--seed 7]
"""

from __future__ import annotations

import argparse
import math

import numpy as np

TAIL = 0.5 * math.erfc(3 / math.sqrt(2))  # 0.135 %: 3 spreads of a normal


def reach(n: int, draws: int, rng: np.random.Generator, chunk: int = 500_000) -> float:
    """The k at which an ordinary probe falls below the median of ``n`` ordinary peers by
    more than k robust spreads with probability :data:`TAIL`."""
    z = []
    for start in range(0, draws, chunk):
        size = min(chunk, draws - start)
        peers = rng.standard_normal((size, n))
        centre = np.median(peers, axis=1)
        spread = 1.4826 * np.median(np.abs(peers - centre[:, None]), axis=1)
        z.append((rng.standard_normal(size) - centre) / spread)
    return float(-np.quantile(np.concatenate(z), TAIL))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--draws", type=int, default=4_000_000)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--few", type=int, default=32, help="tabulate n below this")
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    table = {n: reach(n, args.draws, rng) for n in range(4, args.few)}
    print("FEW_K = {" + ", ".join(f"{n}: {k:.3g}" for n, k in table.items()) + "}")
    fits = []
    for n in (args.few, 48, 64, 96, 128):
        k = reach(n, args.draws, rng)
        fits.append(n * (k / 3 - 1))
        print(f"n {n}: k {k:.3f}, c {fits[-1]:.2f}")
    print(f"MANY_C = {max(fits):.1f} (the largest c of n >= {args.few}: never below the tail)")


if __name__ == "__main__":
    main()
