"""What does the harness cost? Its step against a bare hand-written step, paired in one process.

A shared machine's noise (other work, frequency, the neighbours of a VM) swamps a 2%
difference between two runs measured one after the other: rounds of separate
processes spread by +-15-30% here. So both loops run in ONE process, interleaved, and
every comparison is paired in time:

- the harness side is the study's own code driven as a trial drives it: the spec
  resolved by the study's loader, the launcher's and the backend's environment
  variables (``runtimes.measured.environment``), ``trainer.Trainer`` (threads, backend setup,
  model, data, channels_last), ``harness.before_steps`` (compile-pool wait, FLOP
  count, noise probe: their allocations stay behind, as in a trial), and every step
  through ``harness.timed_step`` with the trial log's progress line;
- the bare side is the loop its users write by hand, built after it in the same
  process, ``time.perf_counter`` around the step, ``loss.item()`` after it: for an
  image model the article's (the model from the same seed, SGD, CrossEntropyLoss, one
  fixed batch, in channels_last once when asked, autocast for bf16); for a text model
  a Hugging Face fine-tuning loop as Accelerate's nlp_example runs it, without
  Accelerate (the transformers model built from the study's configuration of it with
  transformers' own default attention, ``torch.optim.AdamW(lr=2e-5)`` or SGD as the
  spec's optimizer, one batch of token ids with its attention mask and labels, the
  model's own loss, ``optimizer.step()``, ``lr_scheduler.step()`` of
  ``get_linear_schedule_with_warmup``, ``optimizer.zero_grad()``).

After ``--warmup`` steps of each, ``--rounds`` rounds each run a block of ``--block``
harness steps and a block of bare steps, in ABBA order (harness first in even
rounds). A round's ratio is the bare block's time over the harness block's: the
harness's throughput over the bare loop's, > 1 = harness faster. The estimate is the
median of the rounds' ratios with its distribution-free 95% confidence interval (order
statistics of the sign test: a round disturbed by something else moves it by one
rank, not by its size); PASS when the whole interval is at or above ``--threshold``
(0.98). The geometric mean with Student's t interval is printed beside it.

Run it with the workflow's python (it resolves the spec) and a backend environment's
python for the training process, on a machine left alone (it trains for real):

    .venv/bin/python tests/benchmarks/harness_overhead.py --python .venvs/upstream-*/bin/python
    .venv/bin/python tests/benchmarks/harness_overhead.py --python .venvs/upstream-*/bin/python \\
        --model resnet50 --image-size 224 --batch-size 16 --precision bf16 --channels-last \\
        --rounds 30 --out overhead.json          # the study's trial as a user runs it
    .venv/bin/python tests/benchmarks/harness_overhead.py --python .venvs/upstream-*/bin/python \\
        --model bert-base --batch-size 8 --dropout on --rounds 20   # vs the HF loop
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))  # the study's package, in either process
MARK = "RESULT "
# Student's t, two-sided 95% (0.975 quantile), by degrees of freedom
T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306,
        9: 2.262, 10: 2.228, 11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131,
        16: 2.120, 17: 2.110, 18: 2.101, 19: 2.093, 20: 2.086, 21: 2.080, 22: 2.074,
        23: 2.069, 24: 2.064, 25: 2.060, 26: 2.056, 27: 2.052, 28: 2.048, 29: 2.045,
        30: 2.042, 40: 2.021, 60: 2.000, 120: 1.980}  # fmt: skip


def t975(df: int) -> float:
    if df in T975:
        return T975[df]
    above = [d for d in T975 if d > df]
    return T975[min(above)] if above else 1.960


def median_ci(values: list[float], level: float = 0.95) -> tuple[list[float], float]:
    """The distribution-free interval of a median: the k-th smallest and k-th largest
    values, k the largest with P(Binomial(n, 1/2) < k) <= (1 - level) / 2; and its
    exact coverage. Fewer than 6 values cannot give 95%: their whole range (coverage
    below the level)."""
    xs, n = sorted(values), len(values)

    def below(k: int) -> float:  # P(Binomial(n, 1/2) <= k - 1)
        return sum(math.comb(n, i) for i in range(k)) / 2**n

    k = 1
    while k + 1 <= n // 2 and below(k + 1) <= (1 - level) / 2:
        k += 1
    return [xs[k - 1], xs[n - k]], 1 - 2 * below(k)


def paired_estimate(ratios: list[float]) -> dict:
    """The median of paired ratios with its 95% interval, and the geometric mean with
    Student's t interval on the logarithms."""
    logs = [math.log(r) for r in ratios]
    n = len(logs)
    mean = statistics.fmean(logs)
    half = t975(n - 1) * statistics.stdev(logs) / math.sqrt(n) if n > 1 else math.inf
    ci, coverage = median_ci(ratios)
    return {
        "median": statistics.median(ratios),
        "ci95": ci,
        "ci_coverage": coverage,
        "geometric_mean": math.exp(mean),
        "geometric_mean_ci95": [math.exp(mean - half), math.exp(mean + half)],
        "rounds": n,
        "round_ratio_min": min(ratios),
        "round_ratio_max": max(ratios),
    }


# --------------------------------------------------------------------------- the child


def bare_text_step(spec: dict):
    """A Hugging Face user's fine-tuning step, written out by hand."""
    import torch
    import transformers

    from workflow_scripts import workloads  # the model's sizes only

    w = workloads.get(spec["model"])
    torch.manual_seed(spec["seed"])
    cls = getattr(transformers, w.hf_class)
    given = workloads.with_dropout(w.hf_config) if spec["dropout"] else w.hf_config
    model = cls(cls.config_class(**given, use_cache=False))
    model.train()
    if spec["optimizer"] == "adamw":
        optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5)
    else:
        optimizer = torch.optim.SGD(model.parameters(), lr=spec["lr"], momentum=0.9)
    total = spec["warmup_steps"] + spec["steps"]
    scheduler = transformers.get_linear_schedule_with_warmup(optimizer, 100, total)
    gen = torch.Generator().manual_seed(spec["seed"])
    ids = torch.randint(0, w.hf_config["vocab_size"], (spec["batch_size"], spec["seq_len"]),
                        generator=gen)  # fmt: skip
    labels = ids if w.task == "causal-lm" else torch.randint(0, w.num_classes, (len(ids),))
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}
    bf16 = spec["precision"] == "bf16"

    def step() -> float:
        start = time.perf_counter()
        autocast = torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()
        with autocast:
            loss = model(**batch).loss
        loss.backward()
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        elapsed = time.perf_counter() - start
        loss.item()
        return elapsed

    return step


def bare_step(spec: dict):
    """The hand-written loop's step, nothing but the training step and a stopwatch."""
    import torch

    from workflow_scripts import workloads
    from workflow_scripts.rank import models  # the model constructors only

    if workloads.get(spec["model"]).text:
        return bare_text_step(spec)

    torch.manual_seed(spec["seed"])
    n_classes = workloads.get(spec["model"]).num_classes
    model = models.build(spec["model"])
    model.train()
    gen = torch.Generator().manual_seed(spec["seed"])
    size, bs = spec["image_size"], spec["batch_size"]
    x = torch.randn(bs, 3, size, size, generator=gen)
    y = torch.randint(0, min(10, n_classes), (bs,), generator=gen)
    if spec["channels_last"]:
        model = model.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
    optimizer = torch.optim.SGD(model.parameters(), lr=spec["lr"], momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    bf16 = spec["precision"] == "bf16"

    def step() -> float:
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        autocast = torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()
        with autocast:
            loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
        elapsed = time.perf_counter() - start
        loss.item()
        return elapsed

    return step


def child(spec: dict, cfg: dict) -> int:
    import torch

    from workflow_scripts import launchers
    from workflow_scripts.rank import harness, measure
    from workflow_scripts.rank.trainer import Trainer

    launchers.get(spec["launcher"]).verify(spec)
    trainer = Trainer(spec)
    measure.before_steps(spec, None)
    bare = bare_step(spec)
    progress = harness.progress_printer()
    total = cfg["warmup"] + cfg["rounds"] * cfg["block"]
    k = 0
    for _ in range(cfg["warmup"]):
        harness.timed_step(trainer, k, total, progress)
        k += 1
        bare()
    rounds = []
    for r in range(cfg["rounds"]):
        order = ("harness", "bare") if r % 2 == 0 else ("bare", "harness")
        got: dict = {"order": list(order)}
        for kind in order:
            times = []
            for _ in range(cfg["block"]):
                if kind == "harness":
                    times.append(harness.timed_step(trainer, k, total, progress)[0])
                    k += 1
                else:
                    times.append(bare())
            got[kind] = times
        rounds.append(got)
    print(MARK + json.dumps({"rounds": rounds, "threads": torch.get_num_threads()}), flush=True)
    return 0


# --------------------------------------------------------------------------- the session


def resolve_spec(cfg: dict) -> dict:
    """The spec through the study's own loader (its defaults, the given fields)."""
    from workflow_scripts import study, workloads

    text = workloads.get(cfg["model"]).text
    fields = {
        "id": "harness-overhead",
        "model": cfg["model"],
        **({"seq_len": cfg["seq_len"]} if text else {"image_size": cfg["image_size"]}),
        "batch_size": cfg["batch_size"],
        "precision": cfg["precision"],
        "channels_last": cfg["channels_last"],
        "launcher": cfg["launcher"],
        "probe_size": cfg["probe_size"],
        "warmup_steps": cfg["warmup"],
        "steps": cfg["rounds"] * cfg["block"],
    }
    if cfg["threads"]:
        fields["threads"] = cfg["threads"]
    if cfg.get("optimizer"):
        fields["optimizer"] = cfg["optimizer"]
    if text:
        fields["dropout"] = cfg.get("dropout", "off") == "on"
    config = {"groups": {"g": {"runs": [fields]}}}
    return json.loads(study.load_study(config).spec_json(fields["id"]))


def run_child(python: str, spec: dict, cfg: dict, log: Path) -> dict:
    from workflow_scripts import runtimes
    from workflow_scripts.runtimes import measured

    prefix = str(Path(python).parent.parent)
    runtime = runtimes.for_env({"python": python, "prefix": prefix, "name": spec.get("env")})
    env = measured.environment(spec, runtime)
    cmd = [python, "-u", str(Path(__file__).resolve()), "--child", "--spec-json",
           json.dumps(spec), "--config", json.dumps(cfg)]  # fmt: skip
    with open(log, "w") as logf:  # the progress lines go where a trial's go: a log file
        proc = subprocess.run(cmd, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=logf,
                              text=True)  # fmt: skip
    lines = [line for line in proc.stdout.splitlines() if line.startswith(MARK)]
    if proc.returncode != 0 or not lines:
        sys.stderr.write(proc.stdout[-3000:] + log.read_text()[-6000:])
        raise SystemExit(f"the benchmark process failed (exit status {proc.returncode})")
    return json.loads(lines[-1][len(MARK) :])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--python", required="--child" not in (argv or sys.argv),
                    help="a backend environment's python (the training process)")  # fmt: skip
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--block", type=int, default=2, help="steps of each side per round")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps of each side")
    ap.add_argument("--model", default="resnet18", help="a model of workflow_scripts/workloads.py")
    ap.add_argument("--image-size", type=int, default=64)
    ap.add_argument("--seq-len", type=int, default=None, help="a text model's (null: its own)")
    ap.add_argument("--optimizer", default=None, choices=["sgd", "adamw"],
                    help="default: the model family's")  # fmt: skip
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument(
        "--dropout",
        default="off",
        choices=["on", "off"],
        help="a text model's own dropout on both sides (on: as users fine-tune)",
    )
    ap.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    ap.add_argument("--channels-last", action="store_true")
    ap.add_argument("--launcher", default="none", help="the spec's launcher (its environment)")
    ap.add_argument("--threads", type=int, default=None, help="default: the study's")
    ap.add_argument("--probe-size", type=int, default=1024, help="the harness's noise probe")
    ap.add_argument("--threshold", type=float, default=0.98, help="PASS: the interval >= it")
    ap.add_argument("--log", type=Path, default=Path("/tmp/harness-overhead.log"))
    ap.add_argument("--out", type=Path, help="also write every round's figures here (JSON)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--spec-json", help=argparse.SUPPRESS)
    ap.add_argument("--config", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        return child(json.loads(args.spec_json), json.loads(args.config))

    cfg = {
        "model": args.model,
        "image_size": args.image_size,
        "seq_len": args.seq_len,
        "optimizer": args.optimizer,
        "batch_size": args.batch_size,
        "dropout": args.dropout,
        "precision": args.precision,
        "channels_last": args.channels_last,
        "launcher": args.launcher,
        "threads": args.threads,
        "probe_size": args.probe_size,
        "warmup": args.warmup,
        "rounds": args.rounds,
        "block": args.block,
    }
    spec = resolve_spec(cfg)
    print(
        f"harness overhead, paired in one process: {spec['model']} "
        f"{spec['seq_len'] or spec['image_size']}{' tokens' if spec['seq_len'] else 'px'} "
        f"batch {spec['batch_size']} {spec['precision']} {spec['optimizer']}"
        f"{' dropout' if spec.get('dropout') else ''}"
        f"{' channels_last' if spec['channels_last'] else ''}, launcher {spec['launcher']}, "
        f"{args.rounds} rounds of {args.block}+{args.block} steps after {args.warmup} warm-up "
        f"steps each, python {args.python}",
        flush=True,
    )
    got = run_child(args.python, spec, cfg, args.log)
    ratios = []
    for i, r in enumerate(got["rounds"], 1):
        ratio = sum(r["bare"]) / sum(r["harness"])
        ratios.append(ratio)
        print(f"round {i} ({r['order'][0]} first): harness {sum(r['harness']):.3f} s, "
              f"bare {sum(r['bare']):.3f} s, ratio {ratio:.3f}", flush=True)  # fmt: skip
    est = paired_estimate(ratios)
    lo, hi = est["ci95"]
    verdict = "PASS" if lo >= args.threshold else "FAIL"
    harness_steps = [t for r in got["rounds"] for t in r["harness"]]
    bare_steps = [t for r in got["rounds"] for t in r["bare"]]
    est["median_step_ratio"] = statistics.median(bare_steps) / statistics.median(harness_steps)
    if args.out:
        result = {"config": cfg, "spec": spec, "threads": got["threads"], "rounds": got["rounds"],
                  "estimate": est, "verdict": verdict}  # fmt: skip
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"median step: harness {statistics.median(harness_steps):.4f} s, bare "
          f"{statistics.median(bare_steps):.4f} s ({got['threads']} threads)")  # fmt: skip
    glo, ghi = est["geometric_mean_ci95"]
    print(f"geometric mean {est['geometric_mean']:.4f}, t 95% CI [{glo:.4f}, {ghi:.4f}]; round "
          f"ratios {est['round_ratio_min']:.3f}-{est['round_ratio_max']:.3f}")  # fmt: skip
    print(
        f"harness/bare throughput: median of {est['rounds']} paired rounds "
        f"{est['median']:.4f}, {100 * est['ci_coverage']:.1f}% CI [{lo:.4f}, {hi:.4f}], "
        f"threshold {args.threshold:g}: {verdict}"
    )
    return 0 if verdict == "PASS" else 1


if __name__ == "__main__":
    sys.exit(main())
