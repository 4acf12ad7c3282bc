"""How the ccl backend waits: spinning (``STUDY_CCL_WAIT=spin``, the old worker) against
backing off (the default), on this machine, measured in the same run.

Three comparisons, each alternating the two modes (ABBA over ``--rounds``), so that a
drift of the shared machine hits both:

1. the allreduce microbenchmark (``workflow_scripts.collectives``, variant ccl-shm,
   float32, 1 KiB to 100 MiB), with Gloo once beside it: per size the loop latency,
   bus bandwidth, CPU time per wall time, and the backend's own cost per call
   (hand-off to its worker, time in oneCCL, completion to future);
2. a rank waiting for a peer that comes ``SLOW_S`` late (``tests/test_ccl.py``'s
   ``slow`` worker): the waiting process's CPU time per wall time, ccl and Gloo;
3. DDP training, 2 ranks x 1 thread over ccl (``--model``, ``--image-size``,
   ``--batch-size``, 20 timed steps): samples/s, and backoff over spin.

Run it with the workflow's python on a machine left alone (it trains for real):

    .venv/bin/python tests/benchmarks/ccl_wait.py
    .venv/bin/python tests/benchmarks/ccl_wait.py --rounds 4 --model resnet50 --image-size 224
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from tests.ccl_ranks import run_ranks  # noqa: E402
from tests.conftest import spec_of  # noqa: E402
from workflow_scripts import collectives, envs, trial  # noqa: E402

SIZES_KB = [1, 16, 256, 4096, 65536, 102400]
MODES = ("spin", "backoff")


@contextlib.contextmanager
def wait_mode(mode: str):
    old = os.environ.get("STUDY_CCL_WAIT")
    os.environ["STUDY_CCL_WAIT"] = mode
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("STUDY_CCL_WAIT", None)
        else:
            os.environ["STUDY_CCL_WAIT"] = old


def env_info(name: str, root: Path, log) -> dict:
    return envs.build(name, REPO / "envs" / f"{name}.txt", root, sys.executable, "uv", log)


def order(rounds: int) -> list[str]:
    """ABBA: spin, backoff, backoff, spin, ..."""
    return [MODES[(r + (r // 2)) % 2] for r in range(2 * rounds)][: 2 * rounds]


def microbenchmark(variant: str, env: dict, work: Path, tag: str) -> dict:
    record = collectives.run(
        variant, env, work / f"{variant}-{tag}.json", work / f"{variant}-{tag}.log",
        ranks=2, bench=collectives.Benchmark(SIZES_KB, ["float32"], iterations=20, timeout_s=900),
    )  # fmt: skip
    if record.get("status") != "ok":
        raise SystemExit(f"{variant} ({tag}) failed: {record.get('error')}")
    return {r["bytes"]: r for r in record["results"]}


def slow_peer(ccl_env: dict, work: Path, tag: str) -> dict:
    out = work / f"slow-{tag}"
    out.mkdir()
    ranks = run_ranks(ccl_env, "slow", out, 120)
    info = ranks[0]["json"] or {}
    return {k: info[k]["cpu_s"] / info[k]["wall_s"] for k in ("ccl", "gloo") if k in info}


def ddp(env: dict, work: Path, tag: str, args) -> float:
    spec = spec_of(id=f"ddp-{tag}", model=args.model, image_size=args.image_size,
                   batch_size=args.batch_size, steps=20, warmup_steps=3, launcher="torchrun",
                   ranks=2, threads=1, dist_backend="ccl", timeout_s=1800)  # fmt: skip
    rec = trial.run(spec, env, work / f"ddp-{tag}.json", work / f"ddp-{tag}.log", max_retries=0)
    if rec["status"] != "ok":
        raise SystemExit(f"DDP ({tag}) {rec['status']}: {rec.get('error')}")
    return rec["metrics"]["samples_per_s"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--envs-root", type=Path, default=Path(os.environ.get("STUDY_ENVS_ROOT", REPO / ".venvs"))
    )
    ap.add_argument("--rounds", type=int, default=2, help="ABBA rounds of spin/backoff pairs")
    ap.add_argument("--model", default="resnet18")
    ap.add_argument("--image-size", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--out", type=Path, help="write every figure as JSON here")
    args = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="ccl-wait-"))
    with open(work / "envs.log", "w") as log:
        upstream, oneccl = (
            env_info("upstream", args.envs_root, log),
            env_info("oneccl", args.envs_root, log),
        )
    ccl_env = {"python": oneccl["python"], "lib": Path(oneccl["extensions"]["ccl"]["dir"])}

    figures: dict = {"micro": {m: [] for m in MODES}, "slow": {m: [] for m in MODES},
                     "ddp": {m: [] for m in MODES}}  # fmt: skip
    gloo = microbenchmark("gloo", upstream, work, "gloo")
    for i, mode in enumerate(order(args.rounds)):
        with wait_mode(mode):
            figures["micro"][mode].append(microbenchmark("ccl-shm", oneccl, work, f"{mode}{i}"))
            figures["slow"][mode].append(slow_peer(ccl_env, work, f"{mode}{i}"))
            figures["ddp"][mode].append(ddp(oneccl, work, f"{mode}{i}", args))
        print(f"round {i}: {mode} done", flush=True)

    def med(values):
        return statistics.median(values)

    print("\nallreduce, 2 ranks, float32 (median over rounds; loop latency per call)")
    head = "ms   GB/s  cpu  handoff_us in_ccl_us finish_us"
    print(f"{'size':>10} | {'gloo ms':>8} {'GB/s':>5} {'cpu':>4} | "
          + " | ".join(f"{m} {head}" for m in MODES))  # fmt: skip
    for nbytes in sorted(gloo):
        g = gloo[nbytes]
        cells = []
        for mode in MODES:
            runs = [r[nbytes] for r in figures["micro"][mode]]
            o = [r["overhead_us"] for r in runs]

            def m(key, rows=runs):
                return med([r[key] for r in rows])

            cells.append(
                f"{med([r['latency_s']['loop'] for r in runs]) * 1e3:8.3f} "
                f"{m('busbw_GBps'):5.2f} {m('cpu_per_wall'):4.2f} {m('handoff_us', o):10.1f} "
                f"{m('in_ccl_us', o):9.1f} {m('finish_us', o):9.2f}"
            )
        lat = g["latency_s"]["loop"] * 1e3
        print(f"{nbytes / 1024:>7g} KiB | {lat:8.3f} {g['busbw_GBps']:5.2f} "
              f"{g['cpu_per_wall']:4.2f} | " + " | ".join(cells))  # fmt: skip
    print("\nwaiting 4 s for a late peer: CPU time / wall time of the waiting process")
    for mode in MODES:
        runs = figures["slow"][mode]
        ccl, gloo_ = med([r["ccl"] for r in runs]), med([r["gloo"] for r in runs])
        print(f"  {mode:8}: ccl {ccl:.3f}, gloo {gloo_:.3f}")
    print(f"\nDDP {args.model} {args.image_size}px batch {args.batch_size}, 2 ranks x 1, ccl:")
    for mode in MODES:
        print(f"  {mode:8}: samples/s " + ", ".join(f"{v:.2f}" for v in figures["ddp"][mode]))
    ratio = med(figures["ddp"]["backoff"]) / med(figures["ddp"]["spin"])
    print(f"  backoff / spin (medians): {ratio:.3f}")
    if args.out:
        args.out.write_text(json.dumps({"gloo": gloo, **figures}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
