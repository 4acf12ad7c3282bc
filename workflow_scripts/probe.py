"""Noise probe: how fast this process multiplies dense matrices, right now.

A short calibration run of ``torch.matmul`` on two N x N matrices, in fp32 and in
bf16, each repeated (after one warm-up) until at least ``min_seconds`` have
passed, reported as GFLOP/s (2 N^3 floating-point operations per matmul). The
harness runs it in the training process just before the steps, so it sees the
same threads, pinning and allocator; a trial whose probe is well below what the
machine usually reaches was disturbed by something else running.

Standard library and torch only (it runs in the backend environments); torch is
imported inside the functions, so the trial policy and the report can use the pure
helpers (:func:`summarize`, :func:`reference_rate`) without it.

    python -m workflow_scripts.probe --size 1024                # one probe, as JSON
    python -m workflow_scripts.probe --calibrate --sizes 1024 --threads auto --repeats 3 \\
        --out results/calibration/upstream.json                    # the reference
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import statistics
import sys
import time
from pathlib import Path

from .util import finite, int_list, write_json_atomic

DEFAULT_SIZE = 1024
MIN_SECONDS = 0.3
DTYPES = ("fp32", "bf16")
# The sizes the calibration tries for the machine's matmul ceiling (the best of them);
# larger ones are skipped once a size runs slower than the one before it.
CEILING_SIZES = (1024, 2048, 4096)
CEILING_REPEATS = 2


def load_avg() -> list[float] | None:
    try:
        return [round(x, 3) for x in os.getloadavg()]
    except OSError:
        return None


def matmul_gflops(size: int, dtype: str, min_seconds: float = MIN_SECONDS) -> float:
    """GFLOP/s of ``torch.matmul`` on two size x size CPU matrices of ``dtype``.

    One untimed warm-up, then matmuls until ``min_seconds`` have passed. The
    inputs come from a private generator: the global RNG (which the training
    data may use) is left alone.
    """
    import torch

    torch_dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype]
    gen = torch.Generator().manual_seed(1234)
    a = torch.randn(size, size, generator=gen).to(torch_dtype)
    b = torch.randn(size, size, generator=gen).to(torch_dtype)
    with torch.no_grad():
        torch.matmul(a, b)  # warm-up: packing, thread pool, kernel selection
        reps = 0
        t0 = time.perf_counter()
        while True:
            torch.matmul(a, b)
            reps += 1
            elapsed = time.perf_counter() - t0
            if elapsed >= min_seconds:
                break
    return 2.0 * size**3 * reps / elapsed / 1e9


def run(size: int = DEFAULT_SIZE, min_seconds: float = MIN_SECONDS) -> dict:
    """One probe in this process, with its current threads (the record's ``probe``)."""
    import torch

    before = load_avg()
    t0 = time.perf_counter()
    rates = {f"{d}_gflops": matmul_gflops(size, d, min_seconds) for d in DTYPES}
    return {
        **rates,
        "size": size,
        "threads": torch.get_num_threads(),
        "load_avg_before": before,
        "seconds": time.perf_counter() - t0,
    }


# --------------------------------------------------------------------------- reference


def summarize(runs: list[dict]) -> dict:
    """The median rate of each dtype over several probes of one size and thread count."""
    out: dict = {}
    for d in DTYPES:
        values = [r[f"{d}_gflops"] for r in runs if finite(r.get(f"{d}_gflops"))]
        out[f"{d}_gflops"] = statistics.median(values) if values else None
    first = runs[0] if runs else {}
    out["size"] = first.get("size")
    out["threads"] = first.get("threads")
    out["runs"] = runs
    return out


def peak_rate(probe_result: dict, precision: str) -> tuple[str, float | None]:
    """(dtype, GFLOP/s) of the ceiling for a run of this precision."""
    fp32 = probe_result.get("fp32_gflops")
    if precision != "bf16":
        return "fp32", fp32
    bf16 = probe_result.get("bf16_gflops")
    if bf16 is not None and (fp32 is None or bf16 >= fp32):
        return "bf16", bf16
    return "fp32", fp32


def ceiling(
    sizes: tuple[int, ...] = CEILING_SIZES,
    repeats: int = CEILING_REPEATS,
    min_seconds: float = MIN_SECONDS,
) -> dict:
    """The machine's dense matmul ceiling with this process's current threads: per dtype,
    the best rate over ``repeats`` runs at each of ``sizes`` (1024 barely saturates a
    big machine; 4096 does). The best, not the median: a ceiling is what the CPUs
    can do, and a disturbance only ever lowers a rate. A size that runs slower than
    the one before it ends the search for that dtype (the matrices outgrew the caches
    and the rate will not come back)."""
    import torch

    out: dict = {"threads": torch.get_num_threads(), "sizes": {}}
    for d in DTYPES:
        best, best_size, rates = None, None, {}
        for size in sizes:
            rate = max(matmul_gflops(size, d, min_seconds) for _ in range(repeats))
            rates[size] = rate
            if best is not None and rate < best:
                break
            best, best_size = rate, size
        out[f"{d}_gflops"] = best
        out[f"{d}_size"] = best_size
        out["sizes"][d] = rates
    return out


def ceiling_rate(
    reference: dict | None, precision: str, threads
) -> tuple[float | None, str | None, str]:
    """(GFLOP/s, dtype, how it was found) of the calibrated ceiling for a run of this
    precision on ``threads`` threads: the entry measured with that many threads, else the
    nearest count scaled linearly by threads; (None, None, why) without one."""
    ceilings = [c for c in (reference or {}).get("ceiling") or [] if isinstance(c, dict)]
    if not ceilings:
        why = "no calibrated ceiling" if reference else "no calibration"
        return None, None, why + " (recalibrate: snakemake -R calibrate)"
    if not finite(threads) or threads <= 0:
        return None, None, f"the run's thread count {threads!r} is unknown"
    near = nearest_threads(ceilings, threads)
    if near is None:
        return None, None, "the ceilings have no thread count"
    dtype, rate = peak_rate(near, precision)
    if rate is None:
        return None, None, f"the ceiling has no {precision} rate"
    size = near.get(f"{dtype}_size")
    if near["threads"] == threads:
        return float(rate), dtype, f"calibrated {dtype} ceiling, {threads} threads, size {size}"
    scaled = float(rate) * threads / near["threads"]
    return (
        scaled,
        dtype,
        (
            f"calibrated {dtype} ceiling, {near['threads']} threads (size {size}) "
            f"scaled linearly to {threads}"
        ),
    )


def auto_threads(n: int) -> list[int]:
    """Thread counts worth a reference on n CPUs: 1, 2, 4, ... and n itself."""
    counts, t = [], 1
    while t < n:
        counts.append(t)
        t *= 2
    return [*counts, n]


def wait_for_compile_pool(timeout: float = 120.0) -> float | None:
    """Wait until Inductor's compile worker pool, if this process started one, is up.

    Importing IPEX imports ``torch._inductor.async_compile``, which in torch 2.8
    starts the compile worker pool at once (when triton is installed): a sidecar
    process and its workers, each importing torch, about 10 s of CPU on 2 cores.
    A probe (or a training step) in that time shares the cores with them: here
    torch 2.8's fp32 matmul probed at 53-71 GFLOP/s in the first 8 s after the
    import and at 130-145 once the pool was up. Returns the seconds waited, or
    None when no pool is starting (nothing imported Inductor, or torch >= 2.9,
    which starts its pool only when a compile needs it).
    """
    module = sys.modules.get("torch._inductor.async_compile")
    if module is None:
        return None
    compile_ = module.AsyncCompile
    ready = getattr(compile_, "_ready_future", None)  # torch >= 2.9
    pool = getattr(compile_, "process_pool", None)
    if ready is None and getattr(pool, "cache_info", None) and pool.cache_info().currsize:
        ready = getattr(pool(), "ready_future", None)  # torch 2.8: created with the pool
    if ready is None:
        return None
    t0 = time.perf_counter()
    ready.result(timeout=timeout)
    return time.perf_counter() - t0


def calibrate(
    sizes: list[int],
    threads: list[int] | str = "auto",
    repeats: int = 3,
    min_seconds: float = MIN_SECONDS,
    imports: list[str] = (),
    ceiling_sizes: tuple[int, ...] = CEILING_SIZES,
) -> dict:
    """The reference: ``repeats`` probes (median) per size and thread count, for noise
    detection, and per thread count the machine's matmul ceiling (:func:`ceiling`), the
    denominator of a run's % of peak.

    ``threads``: counts to measure, 0 meaning torch's default (all the CPUs this
    process may use), or ``"auto"`` for :func:`auto_threads` of that default; counts
    that resolve to the same number are measured once. ``imports``: modules to import
    first, as the trials do (``backends.env_imports``).
    """
    import importlib

    import torch

    for module in imports:
        importlib.import_module(module)
    pool_wait_s = wait_for_compile_pool()

    default = torch.get_num_threads()
    if threads == "auto":
        threads = auto_threads(default)
    counts = list(dict.fromkeys(t if t > 0 else default for t in threads or [0]))
    before = load_avg()
    t0 = time.perf_counter()
    entries, ceilings = [], []
    for count in counts:
        torch.set_num_threads(count)
        for size in sizes:
            entries.append(summarize([run(size, min_seconds) for _ in range(repeats)]))
        if ceiling_sizes:
            ceilings.append(ceiling(tuple(ceiling_sizes), min_seconds=min_seconds))
    torch.set_num_threads(default)
    main = next(
        (e for e in entries if e["threads"] == default),
        entries[0] if entries else {},
    )
    return {
        "kind": "calibration",
        "size": main.get("size"),
        "threads": main.get("threads"),
        "fp32_gflops": main.get("fp32_gflops"),
        "bf16_gflops": main.get("bf16_gflops"),
        "entries": entries,
        "ceiling": ceilings,
        "repeats": repeats,
        "min_seconds": min_seconds,
        "default_threads": default,
        "compile_pool_wait_s": pool_wait_s,
        "load_avg_before": before,
        "seconds": time.perf_counter() - t0,
        "torch_version": torch.__version__,
        "created_at": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
    }


def nearest_threads(entries: list[dict], threads: int) -> dict | None:
    """The entry measured with the thread count nearest ``threads`` (the larger on a
    tie); None when no entry has one. Its rate scales about linearly with threads."""
    usable = [e for e in entries if finite(e.get("threads")) and e["threads"] > 0]
    if not usable:
        return None
    return min(usable, key=lambda e: (abs(e["threads"] - threads), -e["threads"]))


def reference_rate(
    reference: dict | None, size, threads, dtype: str = "fp32"
) -> tuple[float | None, str]:
    """The reference rate for a probe of ``size`` run with ``threads`` threads, and how
    it was found: an entry measured with the same size and threads, else the entry of
    that size with the nearest thread count scaled linearly by threads (matmul scales
    about linearly with cores), else None with the reason."""
    key = f"{dtype}_gflops"
    if not isinstance(reference, dict):
        return None, "no reference probe"
    entries = [e for e in reference.get("entries") or [] if isinstance(e, dict)]
    if not entries and finite(reference.get(key)):
        entries = [reference]  # a single probe used as the reference
    same_size = [e for e in entries if e.get("size") == size and finite(e.get(key))]
    if not same_size:
        return None, f"the reference has no probe of size {size}"
    for e in same_size:
        if e.get("threads") == threads:
            return float(e[key]), f"reference size {size}, {threads} threads"
    if not finite(threads) or threads <= 0:
        return None, f"the probe's thread count {threads!r} is unknown"
    near = nearest_threads(same_size, threads)
    if near is None:
        return None, "the reference probes have no thread count"
    rate = float(near[key]) * threads / near["threads"]
    return rate, (
        f"reference size {size}, {near['threads']} threads scaled linearly to {threads} threads"
    )


# --------------------------------------------------------------------------- command line


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Measure dense matmul GFLOP/s (fp32 and bf16).")
    ap.add_argument("--size", type=int, default=DEFAULT_SIZE, help="N of the N x N matrices")
    ap.add_argument("--seconds", type=float, default=MIN_SECONDS, help="time per dtype")
    ap.add_argument(
        "--threads",
        default=None,
        help="intra-op threads; with --calibrate a comma list (0 = all) or auto (the default)",
    )
    ap.add_argument(
        "--calibrate", action="store_true", help="median of --repeats probes per size and threads"
    )
    ap.add_argument("--sizes", default=None, help="comma list of sizes for --calibrate")
    ap.add_argument("--repeats", type=int, default=3, help="probes per entry with --calibrate")
    ap.add_argument("--imports", default="", help="comma list of modules to import first")
    ap.add_argument(
        "--ceiling-sizes",
        default=",".join(map(str, CEILING_SIZES)),
        help="with --calibrate: comma list of sizes for the matmul ceiling (empty: none)",
    )
    ap.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    args = ap.parse_args(argv)
    if args.calibrate:
        sizes = int_list(args.sizes) if args.sizes else [args.size]
        threads = int_list(args.threads) if args.threads not in (None, "auto") else "auto"
        imports = [m for m in args.imports.split(",") if m]
        ceiling_sizes = tuple(int_list(args.ceiling_sizes)) if args.ceiling_sizes else ()
        result = calibrate(sizes, threads, args.repeats, args.seconds, imports, ceiling_sizes)
        result["imports"] = imports
    else:
        if args.threads:
            import torch

            torch.set_num_threads(int(args.threads))
        result = run(args.size, args.seconds)
    text = json.dumps(result, indent=1)
    if args.out:
        write_json_atomic(args.out, result)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
