"""One rank of the collectives microbenchmark: allreduce (sum) latency and bandwidth
for each message size and dtype, in the process group of a torchrun launch.

Each size is timed ``iterations`` times (fewer for big messages, once ``budget_s`` is
spent, 3 at least) after 2 warm-up calls, each call between two barriers; a call's time
is the slowest rank's (the ranks' times are reduced with MAX at the end, outside the
timing). Bandwidth follows nccl-tests: algorithm bandwidth = bytes / time, bus
bandwidth = algbw x 2 (n - 1) / n, comparable across rank counts. Every result is
checked (all ones summed over n ranks is n, exact also in bfloat16 for small n).

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


def measure(size_bytes: int, dtype_name: str, iterations: int, budget_s: float) -> dict:
    import torch
    import torch.distributed as dist

    dtype = getattr(torch, dtype_name)
    n = max(1, size_bytes // torch.empty((), dtype=dtype).element_size())
    world = dist.get_world_size()
    t = torch.ones(n, dtype=dtype)
    times = []
    spent = 0.0
    for i in range(WARMUP + iterations):
        t.fill_(1)
        dist.barrier()
        start = time.perf_counter()
        dist.all_reduce(t)
        elapsed = time.perf_counter() - start
        if i == WARMUP - 1 or i == WARMUP + iterations - 1:
            if not bool((t == world).all()):
                raise RuntimeError(f"allreduce of {n} x {dtype_name} ones did not give {world}")
        if i >= WARMUP:
            times.append(elapsed)
            spent += elapsed
            # enough for a median of a slow size; the same count on every rank
            if len(times) >= 3 and ranks.agree(spent >= budget_s):
                break
    slowest = torch.tensor(times, dtype=torch.float64)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    times = slowest.tolist()
    nbytes = n * t.element_size()
    median = statistics.median(times)
    algbw = nbytes / median / 1e9
    return {
        "dtype": dtype_name,
        "bytes": nbytes,
        "elements": n,
        "iterations": len(times),
        "latency_s": {"median": median, "min": min(times), "max": max(times)},
        "times_s": times,
        "algbw_GBps": algbw,
        "busbw_GBps": algbw * 2 * (world - 1) / world,
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
    cpus = ranks.pin(spec)
    import torch

    if spec.get("threads"):
        torch.set_num_threads(int(spec["threads"]))
    result: dict = {"kind": "collectives", "spec": spec, "rank_cpus": cpus}
    try:
        result["group"] = ranks.init_process_group(spec)
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
