"""Does what a process did before its steps change how fast they run?

A CPU training step allocates and frees its activations every step. glibc's malloc
serves a large block with a fresh ``mmap`` (every page faulted in again, zeroed, at
each step) or from its heap (pages kept), by a threshold that it moves itself: up to
the size of the largest mapped block freed so far (at most 32 MiB), so it depends on the
process's history. This runs the same steps (ResNet-50, fp32, SGD, one fixed batch) in
fresh processes of one environment whose only difference is what each did first: nothing;
one block of ``--block-mb`` (a noise probe's 1024 x 1024 fp32 matmul allocates 4 MiB
blocks) or of 30 MiB (a gradient check's reference, a FLOP count) allocated, written and
freed; or the threshold fixed (``MALLOC_MMAP_THRESHOLD_``, which also stops glibc moving
it and its trim threshold). ABBA-rotated rounds; per variant, the median step time of
the steps after ``--warmup``, each run's median, and the minor page faults a step takes
(``getrusage``); each process's median step against its faults, and their correlation.

    .venv/bin/python tests/benchmarks/malloc_history.py --python .venvs/upstream-*/bin/python \\
        [--rounds 3] [--batch-size 16] [--steps 7] [--warmup 2]

Run it with nothing else running.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

MARK = "MALLOC-HISTORY "

CHILD = """
import json, os, resource, sys, time
import torch, torchvision
torch.manual_seed(0)
block = float(os.environ.get("HISTORY_BLOCK_MB") or 0)
if block:
    first = torch.empty(int(block * 2**20) // 4)
    first.fill_(1.0)
    del first
batch, steps, MARK = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
model = torchvision.models.resnet50()
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(batch, 3, 224, 224), torch.randint(0, 1000, (batch,))
loss_fn = torch.nn.CrossEntropyLoss()
out = []
for _ in range(steps):
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    start = time.perf_counter()
    opt.zero_grad(set_to_none=True)
    loss_fn(model(x), y).backward()
    opt.step()
    out.append([time.perf_counter() - start,
                resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults])
print(MARK + json.dumps({"threads": torch.get_num_threads(), "steps": out}), flush=True)
"""


def variants(block_mb: float) -> dict[str, dict[str, str]]:
    return {
        "nothing first": {},
        f"{block_mb:g} MiB freed first": {"HISTORY_BLOCK_MB": f"{block_mb:g}"},
        "30 MiB freed first": {"HISTORY_BLOCK_MB": "30"},
        "threshold fixed at 32 MiB": {"MALLOC_MMAP_THRESHOLD_": str(32 * 2**20)},
    }


def run(python: str, env: dict[str, str], batch: int, steps: int) -> dict:
    proc = subprocess.run(
        [python, "-c", CHILD, str(batch), str(steps), MARK],
        env={**os.environ, **env}, capture_output=True, text=True, check=False,
    )  # fmt: skip
    lines = [line for line in proc.stdout.splitlines() if line.startswith(MARK)]
    if proc.returncode != 0 or not lines:
        raise SystemExit(f"the run failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(lines[-1][len(MARK) :])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--python", required=True,
                   help="an environment's interpreter (torch, torchvision)")  # fmt: skip
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--steps", type=int, default=7)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--block-mb", type=float, default=4.0)
    args = p.parse_args(argv)
    kinds = variants(args.block_mb)
    got: dict[str, list[dict]] = {k: [] for k in kinds}
    for r in range(args.rounds):
        for kind in list(kinds) if r % 2 == 0 else list(reversed(kinds)):
            got[kind].append(run(args.python, kinds[kind], args.batch_size, args.steps))
    threads = sorted({one["threads"] for runs in got.values() for one in runs})
    print(f"ResNet-50, batch {args.batch_size}, fp32, {threads} threads, {args.rounds} "
          f"processes each, steps {args.warmup + 1}-{args.steps} of each")  # fmt: skip
    base, each = None, []  # each: every process's (median step s, median faults a step)
    for kind, runs in got.items():
        mine = [tuple(statistics.median(col) for col in zip(*one["steps"][args.warmup :]))
                for one in runs]  # fmt: skip
        each += mine
        step = statistics.median(t for one in runs for t, _ in one["steps"][args.warmup :])
        faults = statistics.median(f for one in runs for _, f in one["steps"][args.warmup :])
        base = base or (step, faults)
        shown = [(round(t, 2), round(f / 1000)) for t, f in mine]
        print(f"  {kind:27} median step {step:.3f} s ({step / base[0]:.3f}x)  each {shown}  "
              f"faults/step {faults:,.0f} ({faults / base[1]:.3f}x)")  # fmt: skip
    times, faults = zip(*each)
    print("  each process (median step s, thousand faults/step): "
          f"{sorted((round(t, 2), round(f / 1000)) for t, f in each)}")  # fmt: skip
    print(f"  their correlation: {statistics.correlation(times, faults):.2f} over {len(each)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
