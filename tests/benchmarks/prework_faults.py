"""Does the work a trial does before its steps change the steps? The article's ResNet-50
loop (``hf_loop.py``'s plain vision side: torchvision's model, SGD at 0.01 with momentum
0.9, one batch of random images reused) in fresh processes, each preceded by one of:

- ``none``: nothing (a user's loop);
- ``probe``: the study's noise probe (``rank/probe.py``: fp32 matmuls at 1024, as a
  trial's ``probe`` before its steps; ``--dtypes fp32,bf16`` adds bf16), its matrices
  in memory of their own (``probe.OUTSIDE_HEAP``);
- ``probe-heap``: the same probe with its matrices from torch's allocator, as before;
- ``flops``: the study's FLOP count (``rank/measure.py``: one forward and backward at
  batch 1 of a fresh copy of the model, as a first trial does before its setup), on
  fake tensors;
- ``flops-real``: the same count on real CPU tensors, as before;
- ``both``: the FLOP count, then the probe (a first trial's order); ``both-old``: the
  same as before (real tensors, the probe's matrices from torch's allocator).

Variants alternate round by round (the order rotated each round), each a process of
its own; per variant the mean step time and minor page faults a timed step (glibc's
allocator returns large blocks to the kernel and takes them again: a step that faults
less is faster), and each variant's mean step over ``none``'s, with the interval of
``harness_overhead.paired_estimate`` over the rounds. Run on a machine left alone:

    .venv/bin/python tests/benchmarks/prework_faults.py --rounds 6 --variants none,both,both-old
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from tests.benchmarks.harness_overhead import paired_estimate  # noqa: E402
from tests.benchmarks.hf_loop import PLAIN_VISION, plain_side  # noqa: E402

# what the trial does first, then hf_loop.py's plain vision loop (the article's)
PREWORK = r"""
import json, sys
cfg = json.loads(sys.argv[1])
spec = {"model": cfg["model"], "seed": 0, "mode": "train", "image_size": cfg["image_size"],
        "batch_size": cfg["batch_size"]}
old = cfg["variant"] in ("probe-heap", "flops-real", "both-old")
if cfg["variant"] in ("flops", "flops-real", "both", "both-old"):
    from workflow_scripts.rank import measure
    assert measure.count_flops_per_sample(spec, fake=not old)
if cfg["variant"] in ("probe", "probe-heap", "both", "both-old"):
    from workflow_scripts.rank import probe
    probe.OUTSIDE_HEAP = not old
    probe.run(1024, dtypes=tuple(cfg["dtypes"]))
"""
LOOP = PREWORK + PLAIN_VISION

VARIANTS = ("none", "probe", "probe-heap", "flops", "flops-real", "both", "both-old")


def one(python: str, cfg: dict) -> dict:
    samples_per_s, faults = plain_side(python, cfg, LOOP)
    return {"step_s": cfg["batch_size"] / samples_per_s, "faults": faults}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="resnet50")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--image-size", type=int, default=224)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--dtypes", default="fp32")
    ap.add_argument("--python", default=str(REPO / ".venvs/upstream/bin/python"))
    ap.add_argument("--out", default=None, help="write the rounds as JSON here")
    args = ap.parse_args(argv)
    variants = args.variants.split(",")
    cfg = {
        "model": args.model, "batch_size": args.batch_size, "image_size": args.image_size,
        "warmup": args.warmup, "steps": args.steps, "dtypes": args.dtypes.split(","),
        "precision": "fp32",
    }  # fmt: skip
    rounds: list[dict] = []
    for r in range(args.rounds):
        k = r % len(variants)
        got = {}
        for v in variants[k:] + variants[:k]:
            got[v] = one(args.python, {**cfg, "variant": v})
            print(f"round {r} {v:10s}: step {got[v]['step_s']:.3f} s, "
                  f"{got[v]['faults'] / 1e3:.0f}K faults a step", flush=True)  # fmt: skip
        rounds.append(got)
    print(f"\n{args.model} batch {args.batch_size}, {args.rounds} rounds, python {args.python}")
    for v in variants:
        steps = [g[v]["step_s"] for g in rounds]
        faults = [g[v]["faults"] / 1e3 for g in rounds]
        line = (f"{v:10s}: median of the mean steps {statistics.median(steps):.3f} s "
                f"({min(steps):.3f}-{max(steps):.3f}), faults a step "
                f"{min(faults):.0f}-{max(faults):.0f}K")  # fmt: skip
        if v != "none" and "none" in variants:
            est = paired_estimate([g[v]["step_s"] / g["none"]["step_s"] for g in rounds])
            (lo, hi), few, most = (
                est["geometric_mean_ci95"],
                est["round_ratio_min"],
                est["round_ratio_max"],
            )
            line += (f"; step over none's {est['geometric_mean']:.3f} [{lo:.3f}-{hi:.3f}] "
                     f"(rounds {few:.3f}-{most:.3f})")  # fmt: skip
        print(line)
    if args.out:
        Path(args.out).write_text(json.dumps(rounds, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
