"""One rank of the collectives microbenchmark: allreduce (sum) latency and bandwidth
for each message size and dtype, in the process group of a torchrun launch.

Measured as nccl-tests measures: after ``WARMUP`` calls, a barrier, then ``iterations``
allreduces back to back, timed as a loop; the per-iteration time is the loop's time
divided by the iterations, on the slowest rank (the ranks' times are reduced with MAX,
outside the timing). Bandwidth follows nccl-tests: algorithm bandwidth = bytes / time,
bus bandwidth = algbw x 2 (n - 1) / n, comparable across rank counts. The loop's data
is rank-dependent and sums to zero, so it stays exact over any number of iterations,
and is checked after the loop.

Then a checked pass: ``iterations`` more calls (fewer for big messages once
``budget_s`` is spent, 3 at least), each on fresh rank-, iteration- and
element-dependent data (small integers, exact in bfloat16 up to 64 ranks) and each
result checked in full; each call is timed alone between two barriers (the method of
earlier versions: barrier skew and the hand-off to a backend's thread weigh on small
messages), reported as ``per_call``.

With the study's ccl backend, its own counters (``study_ccl.stats()``) over the timed
loop give, per call, the hand-off from the caller to its worker thread, the time inside
oneCCL, and from oneCCL's completion to the future being set (``overhead_us``); and
the process's CPU time over the loop's wall time says how busy waiting is.

    torchrun --nproc-per-node 2 workflow_scripts/rank/distributed/allreduce_bench.py \\
        --spec-json '{"dist_backend": "gloo", ...}' --sizes-kb 1,1024 \\
        --dtypes float32,bfloat16 --out result.rank{rank}.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script by torchrun
    sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from workflow_scripts import launchers, sysinfo  # noqa: E402
from workflow_scripts.rank.distributed import ranks  # noqa: E402
from workflow_scripts.util import write_json_atomic  # noqa: E402

WARMUP = 2
#: the checked pass's data: element e of rank r in call i is 1 + (r + i + e) % PERIOD
PERIOD = 4


def loop_data(n: int, dtype, rank: int, world: int):
    """Rank-dependent values that sum to zero over the ranks (2r - (world - 1)): the
    loop's in-place sums stay exactly zero however many times it runs."""
    import torch

    return torch.full((n,), float(2 * rank - (world - 1)), dtype=dtype)


def checked_expected(index, world: int, call: int, dtype):
    """What the sum over ``world`` ranks of :func:`checked_data` is, element by element
    (``index``: the elements' phase, as int64)."""
    import torch

    table = torch.tensor(
        [sum((k + r + call) % PERIOD + 1 for r in range(world)) for k in range(PERIOD)],
        dtype=torch.float64,
    )
    return table.to(dtype)[index]


def checked_pattern(n: int, dtype):
    """The checked pass's values for every rank and call at once (:func:`checked_data`
    slices it): element j is 1 + j % PERIOD, for n + PERIOD - 1 elements."""
    import torch

    return (torch.arange(n + PERIOD - 1, dtype=torch.int32) % PERIOD + 1).to(dtype)


def checked_data(pattern, rank: int, call: int):
    """Rank ``rank``'s data in call ``call``: element e is 1 + (rank + call + e) % PERIOD,
    a copy of a slice of :func:`checked_pattern` (not five passes over the message)."""
    shift = (rank + call) % PERIOD
    return pattern[shift : shift + pattern.numel() - PERIOD + 1].clone()


def wrong_elements(t, world: int, call: int) -> int:
    """How many elements of a checked call's sum ``t`` differ from
    :func:`checked_expected`'s, every element compared; the expected values repeat every
    PERIOD elements, so they are compared a row of PERIOD at a time, never built whole."""
    import torch

    row = checked_expected(torch.arange(PERIOD), world, call, t.dtype)
    whole = t.numel() // PERIOD * PERIOD
    wrong = int((t[:whole].view(-1, PERIOD) != row).sum())
    return wrong + int((t[whole:] != row[: t.numel() - whole]).sum())


def ccl_stats():
    """The study ccl backend's counters in this process, None when it is not loaded."""
    module = sys.modules.get("study_ccl")
    return module.stats() if module is not None and hasattr(module, "stats") else None


def overheads(before: dict | None, after: dict | None, calls: int) -> dict | None:
    if before is None or after is None or calls < 1:
        return None
    d = {k: after[k] - before[k] for k in after}
    n = max(1, d["collectives"])
    return {
        "handoff_us": d["handoff_ns"] / n / 1e3,
        "in_ccl_us": d["ccl_ns"] / n / 1e3,
        "finish_us": d["finish_ns"] / n / 1e3,
        "spin_us": d["spin_ns"] / n / 1e3,
        "slept_us": d["slept_ns"] / n / 1e3,
        "polls": d["polls"] / n,
        "waited_past_spin": d["waited_past_spin"],
        "collectives": d["collectives"],
    }


def measure(size_bytes: int, dtype_name: str, iterations: int, budget_s: float) -> dict:
    import torch
    import torch.distributed as dist

    dtype = getattr(torch, dtype_name)
    n = max(1, size_bytes // torch.empty((), dtype=dtype).element_size())
    world = dist.get_world_size()
    rank = dist.get_rank()

    # the timed loop
    t = loop_data(n, dtype, rank, world)
    for _ in range(WARMUP):
        dist.all_reduce(t)
    dist.barrier()
    before = ccl_stats()
    cpu = time.process_time()
    start = time.perf_counter()
    for _ in range(iterations):
        dist.all_reduce(t)
    loop_s = time.perf_counter() - start
    cpu_s = time.process_time() - cpu
    after = ccl_stats()
    loop_ok = bool((t == 0).all())

    # the checked pass, one call at a time
    pattern = checked_pattern(n, dtype)
    times, bad = [], []
    spent = 0.0
    for i in range(iterations):
        t = checked_data(pattern, rank, i)
        dist.barrier()
        start = time.perf_counter()
        dist.all_reduce(t)
        elapsed = time.perf_counter() - start
        wrong = wrong_elements(t, world, i)
        if wrong:
            bad.append({"call": i, "wrong_elements": wrong})
        times.append(elapsed)
        spent += elapsed
        # enough for a median of a slow size; the same count on every rank
        if len(times) >= 3 and ranks.agree(spent >= budget_s):
            break

    slowest = torch.tensor([loop_s, cpu_s / loop_s, *times], dtype=torch.float64)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    loop_s, busy, *times = slowest.tolist()
    failures = torch.tensor([0 if loop_ok else 1, len(bad)], dtype=torch.int64)
    dist.all_reduce(failures)
    if int(failures.sum()):
        raise RuntimeError(
            f"allreduce of {n} x {dtype_name} gave wrong sums: the timed loop on "
            f"{int(failures[0])} rank(s), {int(failures[1])} checked call(s) on all ranks"
            + (f" (this rank: {bad[:3]})" if bad else "")
        )
    nbytes = n * t.element_size()
    per_iteration = loop_s / iterations
    algbw = nbytes / per_iteration / 1e9
    median = statistics.median(times)
    factor = 2 * (world - 1) / world
    return {
        "dtype": dtype_name,
        "bytes": nbytes,
        "elements": n,
        "iterations": iterations,
        "latency_s": {
            "loop": per_iteration,
            "median": median,
            "min": min(times),
            "max": max(times),
        },  # fmt: skip
        "per_call": {
            "calls": len(times),
            "times_s": times,
            "median_s": median,
            "busbw_GBps": nbytes / median / 1e9 * factor,
        },  # fmt: skip
        "checked_calls": len(times),
        "algbw_GBps": algbw,
        "busbw_GBps": algbw * factor,
        "cpu_per_wall": busy,
        "overhead_us": overheads(before, after, iterations),
    }


def main(argv: list[str] | None = None) -> int:
    ranks.adopt_slurm()  # a rank that srun started: RANK, WORLD_SIZE, ... from SLURM
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spec-json", required=True, help="dist_backend, ccl_impl, threads, ...")
    ap.add_argument("--sizes-kb", required=True, help="comma list of message sizes in KiB")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--iterations", type=int, default=20)
    ap.add_argument("--budget-s", type=float, default=2.0, help="per size and dtype")
    ap.add_argument("--out", required=True, help="result path ({rank}: the rank's number)")
    args = ap.parse_args(argv)
    spec = json.loads(args.spec_json)
    try:
        cpus, placement_error = ranks.pin(spec), None
    except ValueError as exc:  # e.g. more ranks than CPUs: the result says so
        cpus, placement_error = None, exc
    import torch

    if spec.get("threads"):
        torch.set_num_threads(int(spec["threads"]))
    result: dict = {"kind": "collectives", "spec": spec, "rank_cpus": cpus}
    if cpus:
        result["placement"] = ranks.placement(cpus, sysinfo.cpu_topology())
    try:
        if placement_error:
            raise placement_error
        result["group"] = ranks.init_process_group(spec)
        module = sys.modules.get("study_ccl")
        if module is not None and hasattr(module, "wait_policy"):
            result["group"]["ccl_wait"] = module.wait_policy()
        result["results"] = [
            measure(int(kb * 1024), dtype, args.iterations, args.budget_s)
            for dtype in args.dtypes.split(",")
            for kb in (float(x) for x in args.sizes_kb.split(","))
        ]
        result["status"] = "ok"
        ranks.shutdown()
    except Exception as exc:  # noqa: BLE001 - the result says what failed
        result["status"] = "failed"
        result["error"] = {"type": type(exc).__name__, "message": str(exc)[:2000]}
    result["provenance"] = {**sysinfo.collect(), **sysinfo.torch_info()}
    rank, _, _ = ranks.world()
    write_json_atomic(Path(launchers.rank_path(args.out)), result)
    if result["status"] != "ok":
        print(f"[rank {rank}] {result['error']['message']}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
