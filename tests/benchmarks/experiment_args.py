"""What the trial benchmarks share: their command line (an environment, one experiment
of a preset, its fields changed with ``--set``, and the rounds to run it) and their
summary (each figure's medians and paired ratio)."""

from __future__ import annotations

import argparse
from pathlib import Path

import yaml

from workflow_scripts.study import load_study

REPO = Path(__file__).resolve().parents[2]


def parse(
    description: str, preset: str, experiment: str, rounds: int
) -> tuple[argparse.Namespace, dict]:
    """The parsed arguments, and the experiment's spec as the study plans it."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--env-json", required=True)
    p.add_argument("--preset", default=preset)
    p.add_argument("--experiment", default=experiment)
    p.add_argument("--rounds", type=int, default=rounds)
    p.add_argument("--set", nargs="*", default=[], metavar="FIELD=VALUE",
                   help="experiment fields to change (YAML values), e.g. steps=30")  # fmt: skip
    args = p.parse_args()
    study = load_study(yaml.safe_load((REPO / "config.yaml").read_text()), str(REPO),
                       {"preset": args.preset})  # fmt: skip
    spec = {e["id"]: dict(e) for e in study.experiments}[args.experiment]
    spec.update({k: yaml.safe_load(v) for k, v in (f.split("=", 1) for f in args.set)})
    return args, spec


def print_pairs(a: list[dict], b: list[dict], figures, names: tuple[str, str], width: int) -> None:
    """Each figure (``figures``: its key and what it is) of trials ``a`` against ``b``, run
    in ABBA order: each side's median, and the median ratio of neighbours with its 95 %
    interval."""
    from tests.benchmarks.harness_overhead import paired_estimate

    for key, what in figures:
        x = [row[key] for row in a]
        y = [row[key] for row in b]
        est = paired_estimate([u / v for u, v in zip(x, y)])  # neighbours in ABBA order
        print(f"  {what:{width}} {names[0]} median {sorted(x)[len(x) // 2]:9.2f}  {names[1]} "
              f"median {sorted(y)[len(y) // 2]:9.2f}  {names[0]}/{names[1]} {est['median']:.3f} "
              f"[{est['ci95'][0]:.3f}-{est['ci95'][1]:.3f}]")  # fmt: skip
