"""Does the study's transformer trial do the work a Hugging Face user's loop does, at the
same speed? The study's trial, run through ``snakemake`` as a user runs one, against a
plain fine-tuning loop written out by hand, in the same environment, alternated. With
a vision model (``--model resnet50``), the article's loop instead: torchvision's model,
``torch.optim.SGD(lr=0.01, momentum=0.9)`` (the study's vision defaults),
``zero_grad()`` first, then the forward pass, cross entropy, ``backward``, ``step``,
on one batch of random images reused every step (as the study's synthetic data).

The plain loop is what Accelerate's nlp_example does per step, without Accelerate:
``BertForSequenceClassification`` built from the study's configuration of the model
(random weights; with ``--dropout on``, the default, the model's own dropout, as users
fine-tune and as the study's ``dropout: true`` trains), ``torch.optim.AdamW(lr=2e-5)``, a batch
of token ids with its attention mask and labels, the model's own loss, ``backward``,
``optimizer.step()``, ``lr_scheduler.step()`` (the linear schedule with warm-up),
``optimizer.zero_grad()``, under CPU autocast for bf16; ``time.perf_counter`` around
each step, the loss read after it. Both sides time the same number of steps after the
same warm-up; samples/s = batch x timed steps / their time.

Rounds in ABBA order (study first in even rounds), each side a process of its own; the
result is each side's median samples/s and their ratio (study over plain: 1.00 = the
same speed). Run on a machine left alone:

    .venv/bin/python tests/benchmarks/hf_loop.py --rounds 4 --precision fp32 --batch-size 8
    .venv/bin/python tests/benchmarks/hf_loop.py --optimizer sgd     # the article's optimizer

(bf16 where the CPU has AVX-512 BF16 or AMX: emulated elsewhere, a BERT-base step then
takes minutes.)
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from tests.benchmarks.harness_overhead import paired_estimate  # noqa: E402
from tests.runs import copy_workflow  # noqa: E402

PLAIN = r"""
import json, sys, time, contextlib
import torch, transformers
from workflow_scripts import workloads
cfg = json.loads(sys.argv[1])
w = workloads.get(cfg["model"])
torch.manual_seed(0)
cls = getattr(transformers, w.hf_class)
given = workloads.with_dropout(w.hf_config) if cfg["dropout"] else w.hf_config
model = cls(cls.config_class(**given, use_cache=False))
model.train()
if cfg["optimizer"] == "adamw":
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5)
else:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
total = cfg["warmup"] + cfg["steps"]
scheduler = transformers.get_linear_schedule_with_warmup(optimizer, 100, total)
gen = torch.Generator().manual_seed(0)
shape = (cfg["batch_size"], cfg["seq_len"])
ids = torch.randint(0, w.hf_config["vocab_size"], shape, generator=gen)
batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids),
         "labels": torch.randint(0, w.num_classes, (cfg["batch_size"],), generator=gen)}
bf16 = cfg["precision"] == "bf16"
times = []
for i in range(total):
    start = time.perf_counter()
    with torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext():
        loss = model(**batch).loss
    loss.backward()
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad()
    elapsed = time.perf_counter() - start
    loss.item()
    if i >= cfg["warmup"]:
        times.append(elapsed)
print("RESULT " + json.dumps({"samples_per_s": cfg["batch_size"] * len(times) / sum(times),
                              "steps": len(times), "threads": torch.get_num_threads()}))
"""

PLAIN_VISION = r"""
import json, resource, sys, time, contextlib
import torch, torchvision
from workflow_scripts import workloads
cfg = json.loads(sys.argv[1])
w = workloads.get(cfg["model"])
torch.manual_seed(0)
model = getattr(torchvision.models, cfg["model"])(weights=None, num_classes=w.num_classes)
model.train()
optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
gen = torch.Generator().manual_seed(0)
size = cfg["image_size"]
x = torch.randn(cfg["batch_size"], 3, size, size, generator=gen)
y = torch.randint(0, w.num_classes, (cfg["batch_size"],), generator=gen)
loss_fn = torch.nn.CrossEntropyLoss()
bf16 = cfg["precision"] == "bf16"
total = cfg["warmup"] + cfg["steps"]
times, faults = [], 0
for i in range(total):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    start = time.perf_counter()
    optimizer.zero_grad()
    with torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext():
        loss = loss_fn(model(x), y)
    loss.backward()
    optimizer.step()
    elapsed = time.perf_counter() - start
    loss.item()
    if i >= cfg["warmup"]:
        times.append(elapsed)
        faults += resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
print("RESULT " + json.dumps({"samples_per_s": cfg["batch_size"] * len(times) / sum(times),
                              "steps": len(times), "threads": torch.get_num_threads(),
                              "faults_per_step": faults / len(times)}))
"""


def study_side(wd: Path, cfg: dict, envs_root: str) -> tuple[float, float]:
    """One trial of the experiment through snakemake (as a user runs it): its samples/s."""
    # the trial again (its calibration and environment record, made once, stay)
    for path in (wd / "results").glob("*"):
        if path.name not in ("calibration", "envs"):
            shutil.rmtree(path) if path.is_dir() else path.unlink()
    cmd = [sys.executable, "-m", "snakemake", "--cores", "all", "--configfile", "bench.yaml"]
    cmd += ["--config", "runtime=local", f"envs_root={envs_root}", "noise_retries=0"]
    proc = subprocess.run(cmd, cwd=wd, capture_output=True, text=True, timeout=7200)
    if proc.returncode != 0:
        raise SystemExit(proc.stdout[-3000:] + proc.stderr[-3000:])
    record = json.loads((wd / "results/records/bench/trial0.json").read_text())
    if record["status"] != "ok":
        raise SystemExit(f"the study's trial: {record['status']}: {record.get('error')}")
    m = record["metrics"]
    # the timed steps' own page faults (rank/contention.py), per step
    faults = (record.get("other_work") or {}).get("minor_faults", float("nan"))
    return float(m["samples_per_s"]), faults / max(1, m["steps_timed"])


def plain_side(python: str, cfg: dict, script: str | None = None) -> tuple[float, float]:
    """The plain loop in a process of its own (``script``: another one, printing the same
    RESULT line): its samples/s and page faults a timed step."""
    script = script or (PLAIN if cfg["text"] else PLAIN_VISION)
    proc = subprocess.run(
        [python, "-c", script, json.dumps(cfg)], capture_output=True, text=True,
        timeout=7200, cwd=REPO, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    if proc.returncode != 0 or not line:
        raise SystemExit(proc.stderr[-3000:])
    got = json.loads(line[-1][7:])
    return float(got["samples_per_s"]), float(got.get("faults_per_step", float("nan")))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="bert-base", help="a transformers or torchvision one")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--image-size", type=int, default=224)
    ap.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    ap.add_argument("--optimizer", default="adamw", choices=["adamw", "sgd"])
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--envs-root", default=str(REPO / ".venvs"))
    ap.add_argument(
        "--dropout",
        default="on",
        choices=["on", "off"],
        help="the model's own dropout (on, as users fine-tune) or none",
    )
    ap.add_argument("--out", default=None, help="write the rounds as JSON here")
    args = ap.parse_args(argv)
    dropout = args.dropout == "on"
    from workflow_scripts import workloads

    text = workloads.get(args.model).text
    cfg = {
        "model": args.model, "text": text, "batch_size": args.batch_size,
        "seq_len": args.seq_len, "image_size": args.image_size, "precision": args.precision,
        "optimizer": args.optimizer, "warmup": args.warmup, "steps": args.steps,
        "dropout": dropout,
    }  # fmt: skip
    # every step asked for, on both sides (no early stop)
    experiment = {
        "id": "bench", "model": args.model, "batch_size": args.batch_size,
        "precision": args.precision, "warmup_steps": args.warmup, "steps": args.steps,
        "time_budget_s": None, "step_precision": None, "far_stop": None,
    }  # fmt: skip
    if text:
        experiment.update(seq_len=args.seq_len, optimizer=args.optimizer, dropout=dropout)
    else:  # the family's defaults: SGD, lr 0.01, momentum 0.9, a constant rate
        experiment.update(image_size=args.image_size)
    if text and args.optimizer == "sgd":
        experiment.update(lr=0.01, lr_schedule="linear", lr_warmup_steps=100)
    with tempfile.TemporaryDirectory() as tmp:
        wd = copy_workflow(Path(tmp) / "wf")
        bench = {"preset": "default", "trials": 1, "max_trials": None,
                 "groups": {"g": {"runs": [experiment]}},
                 "collectives": {"variants": []}}  # fmt: skip
        (wd / "bench.yaml").write_text(yaml.safe_dump(bench, sort_keys=False))
        from workflow_scripts import envs

        with open(Path(tmp) / "env.log", "w") as log:  # the study's own (reused when built)
            env = envs.build(
                "upstream", REPO / "envs/upstream.txt", Path(args.envs_root), sys.executable,
                "uv", log,
            )  # fmt: skip
        python = env["python"]
        rounds = []
        for r in range(args.rounds):
            order = ("study", "plain") if r % 2 == 0 else ("plain", "study")
            got, faults = {}, {}
            for side in order:
                got[side], faults[side] = (
                    study_side(wd, cfg, args.envs_root)
                    if side == "study"
                    else plain_side(python, cfg)
                )
            rounds.append({**got, "faults_per_step": faults})
            print(f"round {r + 1}: study {got['study']:.3f}, plain {got['plain']:.3f} samples/s; "
                  f"page faults a timed step: study {faults['study'] / 1000:.0f} thousand, "
                  f"plain {faults['plain'] / 1000:.0f} thousand", flush=True)  # fmt: skip
    from workflow_scripts.report.uncertainty import Spread, interval, verdict

    study = statistics.median(r["study"] for r in rounds)
    plain = statistics.median(r["plain"] for r in rounds)
    # the study's own method: the spread between processes, pooled over both sides
    sides = [[r["study"] for r in rounds], [r["plain"] for r in rounds]]
    ratio, low, high = interval(sides[1], sides[0], Spread.pooled(sides))
    result = {"config": cfg, "rounds": rounds, "study_median": study, "plain_median": plain,
              "ratio_of_medians": ratio, "ci_low": low, "ci_high": high,
              "verdict": verdict(low, high),
              "paired": paired_estimate([r["study"] / r["plain"] for r in rounds])}  # fmt: skip
    print(
        f"study {study:.3f} samples/s, plain loop {plain:.3f} samples/s: ratio of medians "
        f"{ratio:.3f} [{low:.3f}-{high:.3f}] ({result['verdict']}; study over plain; "
        f"{args.rounds} rounds, ABBA)"
    )
    p, (lo, hi) = result["paired"], result["paired"]["geometric_mean_ci95"]
    print(
        f"paired by round (the two sides of a round run back to back): geometric mean of "
        f"the rounds' ratios {p['geometric_mean']:.3f} [{lo:.3f}-{hi:.3f}], rounds "
        f"{p['round_ratio_min']:.3f}-{p['round_ratio_max']:.3f}"
    )
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
