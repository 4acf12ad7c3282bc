"""Does the estimate before any calibration hold with a busy neighbour?

The estimate's basis before a calibration is a quick fp32 matmul rate
(``plan.estimate.quick_fp32_gflops``). This prints that rate measured with the machine
quiet and with a CPU-bound neighbour on every CPU (busy processes, as another user's
job would be), as medians of ``--repeats`` measurements, for the estimate's method (one
thread, by its own CPU time, times the CPUs) and for the wall-clock rate on all CPUs
that it replaced, and each one's loaded/quiet ratio: the estimate's time scales with
1 / rate, so a ratio of 0.5 doubles the hours a dry run prints.

    .venv/bin/python tests/benchmarks/estimate_under_load.py [--repeats 5] [--busy N]

Run it with nothing else running (it makes its own load).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from workflow_scripts.plan.estimate import quick_fp32_gflops  # noqa: E402


def wall_rate_all_cpus(size: int = 512, min_seconds: float = 0.2) -> float:
    """The former quick measurement: wall-clock rate, BLAS on every CPU."""
    import numpy as np

    rng = np.random.default_rng(0)
    a = rng.standard_normal((size, size), dtype=np.float32)
    b = rng.standard_normal((size, size), dtype=np.float32)
    a @ b
    reps, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < min_seconds:
        a @ b
        reps += 1
    return 2.0 * size**3 * reps / (time.perf_counter() - t0) / 1e9


def spin(stop) -> None:
    x = 0
    while not stop.is_set():
        x += 1


def medians(repeats: int) -> tuple[float, float]:
    quick = [quick_fp32_gflops() or 0.0 for _ in range(repeats)]
    wall = [wall_rate_all_cpus() for _ in range(repeats)]
    return statistics.median(quick), statistics.median(wall)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--busy", type=int, default=len(os.sched_getaffinity(0)),
                    help="busy processes beside it (default: one per CPU)")  # fmt: skip
    args = ap.parse_args()
    quiet = medians(args.repeats)
    stop = multiprocessing.Event()
    busy = [multiprocessing.Process(target=spin, args=(stop,)) for _ in range(args.busy)]
    for p in busy:
        p.start()
    time.sleep(1.0)
    try:
        loaded = medians(args.repeats)
    finally:
        stop.set()
        for p in busy:
            p.join()
    print(f"{'method':<44} {'quiet':>10} {'loaded':>10} {'loaded/quiet':>13}")
    names = ("one thread by its CPU time x CPUs (now)", "wall clock, all CPUs (before)")
    for name, q, loaded_rate in zip(names, quiet, loaded, strict=True):
        print(f"{name:<44} {q:>10.1f} {loaded_rate:>10.1f} {loaded_rate / q:>13.2f}")
    print(f"(GFLOP/s, medians of {args.repeats}; {args.busy} busy processes beside it)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
