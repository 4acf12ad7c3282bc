"""Two ranks of the study's ``ccl`` backend worker (``WORKER``, a script in the oneCCL
environment) run side by side (:func:`run_ranks`), for test_ccl.py and the ccl_wait
benchmark."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

from tests.conftest import REPO
from workflow_scripts import shm
from workflow_scripts.launchers.torchrun import free_port

SCRUBBED = ("LD_LIBRARY_PATH", "LD_PRELOAD", "FI_PROVIDER_PATH", "FI_PROVIDER", "STUDY_CCL_DIR")

WORKER = r'''
"""One rank of a test_ccl run: python worker.py MODE RANK PORT OUT_DIR."""
import hashlib, json, os, sys, time
from datetime import timedelta

mode, rank, port, out = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
info = {"rank": rank}
SLOW_S = 4.0  # how late the slow peer is

from workflow_scripts.rank.distributed import ccl

info["registered"] = ccl.register()
assert ccl.register() == info["registered"]  # idempotent

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


def write():
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(info, f, indent=1)


def digest(t):
    return hashlib.sha256(t.detach().contiguous().view(torch.uint8).numpy().tobytes()).hexdigest()


timeout = timedelta(seconds=10 if mode == "dead" else 60)
dist.init_process_group(
    "ccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2, timeout=timeout
)
info["backend"] = dist.get_backend()

if mode == "dead":
    t = torch.ones(10)
    dist.all_reduce(t)
    info["first"] = t.tolist()
    if rank == 1:
        write()
        os._exit(1)  # dies without a word; rank 0 waits in its next allreduce
    start = time.monotonic()
    try:
        dist.all_reduce(t)
        info["second"] = "completed"
    except Exception as exc:
        error = exc
        info["error"] = f"{type(exc).__name__}: {exc}"
    info["elapsed_s"] = time.monotonic() - start
    start = time.monotonic()
    try:
        dist.all_reduce(t)
    except Exception as exc:
        info["later_error"] = f"{type(exc).__name__}: {exc}"
    info["later_elapsed_s"] = time.monotonic() - start
    write()
    if "error" in info:
        raise error  # uncaught: the process must still exit, with the error on stderr
    sys.exit(0)

if mode == "slow":
    # Rank 1 is late to each allreduce by SLOW_S; rank 0 measures what its process spends
    # waiting (CPU time over wall time), on the ccl group and on a gloo group.
    import study_ccl

    gloo = dist.new_group(backend="gloo")
    info["wait_policy"] = study_ccl.wait_policy()
    for name, group in (("ccl", None), ("gloo", gloo)):
        t = torch.ones(1000)
        dist.all_reduce(t, group=group)  # both ready: the size class's usual time
        dist.barrier(group=gloo)
        study_ccl.reset_stats()
        if rank == 1:
            time.sleep(SLOW_S)
        wall, cpu = time.monotonic(), time.process_time()
        dist.all_reduce(t, group=group)
        info[name] = {"wall_s": time.monotonic() - wall, "cpu_s": time.process_time() - cpu,
                      "stats": study_ccl.stats(), "result": t[:3].tolist()}
    write()
    dist.destroy_process_group()
    sys.exit(0)

gloo = dist.new_group(backend="gloo")
ccl2 = dist.new_group(backend="ccl")  # a second ccl group in the same process
checks = {}  # name -> comparison of the ccl result with gloo's
hashes = {}  # name -> sha256 of results that every rank must agree on


def compare(name, got, want, replicated):
    if got.dtype.is_floating_point:
        tol = {torch.bfloat16: (1.6e-2, 1e-2), torch.float16: (1e-3, 1e-3)}.get(
            got.dtype, (1e-5, 1e-6)
        )
        close = torch.allclose(got.double(), want.double(), rtol=tol[0], atol=tol[1])
    else:
        close = torch.equal(got, want)
    diff = (got.double() - want.double()).abs().max().item() if got.numel() else 0.0
    checks[name] = {
        "ok": bool(close and got.dtype == want.dtype and got.shape == want.shape),
        "equal": bool(torch.equal(got, want)),
        "max_abs_diff": diff,
        "dtype": str(got.dtype),
        "numel": got.numel(),
    }
    if replicated:
        hashes[name] = digest(got)


def make(dtype, n, salt, who=None):
    """The same tensor on every run for a given rank (or for rank `who`)."""
    gen = torch.Generator().manual_seed(100_000 * (rank if who is None else who) + 10 * n + salt)
    if dtype.is_floating_point:
        return torch.randn(n, generator=gen).to(dtype)
    low = 0 if dtype == torch.uint8 else -20
    return torch.randint(low, 21, (n,), generator=gen, dtype=dtype)


def both(name, fn, replicated=True):
    """Run fn(group) on the ccl (default) and on the gloo group and compare."""
    compare(name, fn(None), fn(gloo), replicated)


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "int64": torch.int64}
SIZES = (1, 7, 1000003)
for dname, dtype in DTYPES.items():
    ops = ["SUM", "PRODUCT", "MIN", "MAX"] + (["AVG"] if dtype.is_floating_point else [])
    for n in SIZES:
        key = f"{dname}/{n}"

        for op in ops:
            def allreduce(group, op=op):
                t = make(dtype, n, 1)
                dist.all_reduce(t, op=getattr(dist.ReduceOp, op), group=group)
                return t
            both(f"allreduce/{op}/{key}", allreduce)

        for op in ["SUM", "MAX"] + (["AVG"] if dtype.is_floating_point else []):
            def reduce(group, op=op):
                t = make(dtype, n, 9)
                dist.reduce(t, dst=1, op=getattr(dist.ReduceOp, op), group=group)
                # the result is defined on rank 1 only
                return t if rank == 1 else torch.zeros(1, dtype=dtype)
            both(f"reduce/{op}/{key}", reduce, replicated=False)

        def broadcast(group):
            t = make(dtype, n, 2)
            dist.broadcast(t, src=1, group=group)
            return t
        both(f"broadcast/{key}", broadcast)

        def allgather(group):
            outs = [torch.empty(n, dtype=dtype) for _ in range(2)]
            dist.all_gather(outs, make(dtype, n, 3), group=group)
            return torch.stack(outs)
        both(f"allgather/{key}", allgather)

        def all_gather_into_tensor(group):
            flat = torch.empty(2 * n, dtype=dtype)
            dist.all_gather_into_tensor(flat, make(dtype, n, 4), group=group)
            return flat
        both(f"all_gather_into_tensor/{key}", all_gather_into_tensor)

        for op in ["SUM", "MAX"] + (["AVG"] if dtype.is_floating_point else []):
            def reduce_scatter(group, op=op):
                out = torch.empty(n, dtype=dtype)
                ins = [make(dtype, n, 5 + r) for r in range(2)]
                dist.reduce_scatter(out, ins, op=getattr(dist.ReduceOp, op), group=group)
                return out
            both(f"reduce_scatter/{op}/{key}", reduce_scatter, replicated=False)

            def reduce_scatter_tensor(group, op=op):
                out = torch.empty(n, dtype=dtype)
                dist.reduce_scatter_tensor(
                    out, make(dtype, 2 * n, 8), op=getattr(dist.ReduceOp, op), group=group
                )
                return out
            both(f"reduce_scatter_tensor/{op}/{key}", reduce_scatter_tensor, replicated=False)

        dist.barrier()

# A reduction computed locally from both ranks' inputs: the ccl result must match it too.
want = make(torch.int64, 7, 1, who=0) + make(torch.int64, 7, 1, who=1)
t = make(torch.int64, 7, 1)
dist.all_reduce(t)
compare("allreduce/SUM/int64/7 vs local sum", t, want, False)

# Non-contiguous input (a transposed view): reduced in place, through a contiguous copy.
def transposed(group):
    base = make(torch.float32, 21, 11).view(7, 3)
    view = base.t()
    dist.all_reduce(view, group=group)
    return base
both("allreduce/non-contiguous", transposed)

# Other dtypes of the list.
for dtype in (torch.float16, torch.float64, torch.int8, torch.uint8, torch.int32):
    def small(group, dtype=dtype):
        t = make(dtype, 7, 12)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
        return t
    both(f"allreduce/MAX/{dtype}", small)

# Async: the work's future completes with the reduced tensor.
def asynchronous(group):
    t = make(torch.float32, 1000003, 13)
    work = dist.all_reduce(t, async_op=True, group=group)
    result = work.get_future().wait()
    assert work.wait() and work.is_completed() and work.is_success(), "work state"
    assert result[0] is t or torch.equal(result[0], t), "future value is the output"
    return result[0]
both("async/allreduce", asynchronous)

# The second ccl group, and a subgroup-free op on it.
def second_group(group):
    t = make(torch.float32, 7, 14)
    dist.all_reduce(t, group=ccl2 if group is None else group)
    return t
both("second_group/allreduce", second_group)

# Errors: clear messages naming the op, and the group still works afterwards.
errors = {}
try:
    dist.all_reduce(make(torch.int64, 7, 15), op=dist.ReduceOp.AVG)
except Exception as exc:
    errors["avg_int"] = f"{type(exc).__name__}: {exc}"
try:
    dist.all_reduce(make(torch.int64, 7, 15), op=dist.ReduceOp.BAND)
except Exception as exc:
    errors["band"] = f"{type(exc).__name__}: {exc}"
try:
    gather_list = [torch.empty(7) for _ in range(2)] if rank == 0 else None
    dist.gather(make(torch.float32, 7, 16), gather_list, dst=0)
except Exception as exc:
    errors["gather"] = f"{type(exc).__name__}: {exc}"
info["errors"] = errors


def after_errors(group):
    t = make(torch.float32, 7, 17)
    dist.all_reduce(t, group=group)
    return t
both("allreduce/after-errors", after_errors)


# DDP: a tiny CNN, different initial weights and data per rank, 5 SGD steps.
def train(group):
    torch.manual_seed(rank)  # DDP must broadcast rank 0's weights
    model = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
        nn.Conv2d(8, 8, 3, stride=2), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        nn.Linear(8, 10),
    )
    ddp = nn.parallel.DistributedDataParallel(model, process_group=group)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    gen = torch.Generator().manual_seed(1000 + rank)
    for _ in range(5):
        x = torch.randn(4, 3, 16, 16, generator=gen)
        y = torch.randint(0, 10, (4,), generator=gen)
        loss = F.cross_entropy(ddp(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])

start = time.monotonic()
both("ddp/params", train)
info["ddp_s"] = time.monotonic() - start

info["checks"] = checks
info["hashes"] = hashes
write()
dist.destroy_process_group()
info["destroyed"] = True
write()
'''


def run_ranks(ccl_env: dict, mode: str, out: Path, timeout: float) -> list[dict]:
    """Run both ranks of the worker; returns per rank its exit code, output, duration
    and the JSON it wrote. Never hangs: ranks still running at `timeout` are killed."""
    script = out / "worker.py"
    script.write_text(WORKER)
    env = {k: v for k, v in os.environ.items() if k not in SCRUBBED and not k.startswith("CCL_")}
    env.update(PYTHONPATH=str(REPO), STUDY_CCL_DIR=str(ccl_env["lib"]))
    port = str(free_port())
    start = time.monotonic()
    procs = [
        subprocess.Popen(
            [ccl_env["python"], str(script), mode, str(rank), port, str(out)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
            cwd=out,
        )
        for rank in range(2)
    ]
    ranks = []
    for rank, proc in enumerate(procs):
        try:
            output, _ = proc.communicate(timeout=max(1.0, timeout - (time.monotonic() - start)))
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            output, _ = proc.communicate()
            output += f"\n[killed after {timeout} s]"
        result = out / f"rank{rank}.json"
        ranks.append(
            {
                "returncode": proc.returncode,
                "output": output,
                "seconds": time.monotonic() - start,
                "json": json.loads(result.read_text()) if result.exists() else None,
            }
        )
    # a rank that died or was killed leaves oneCCL's shm segments behind: these ranks
    # are this test's own processes, not a study run's, so the test removes them
    shm.remove([p.pid for p in procs])
    return ranks


def describe(ranks: list[dict]) -> str:
    return "\n".join(
        f"--- rank {i} (exit {r['returncode']}):\n{r['output'][-4000:]}"
        for i, r in enumerate(ranks)
    )
