"""How often the report's verdicts are wrong: simulated studies run through the project's
own statistics (``report.uncertainty.with_spread`` and ``between``, the adaptive rounds'
``plan.rounds.continuing``, the headline's ``report.headline.pick``), on synthetic
trials with log-normal noise between them (in one row, with a heavier tail: a share of
trials slowed by a neighbour).

A study is a baseline and its candidates, each with a true speedup and its own spread
between trials; every experiment runs ``trials`` trials, then the rounds go on as the
workflow's do (another trial only for an experiment that an undecided comparison names,
or the headline's pair while its interval is wider than the margin) up to
``max_trials``. What the final report says is scored against the truth:

* ``false``: the share of comparisons of an experiment identical to its baseline that
  came out faster or slower (each way at most 2.5 % by design);
* ``coverage``: the share of intervals that hold the true ratio (95 % by design);
* ``crowned``: the share of studies whose headline names a configuration known to beat
  the baseline (its pick, or another candidate where the pick is not known to) when
  all K are as fast as it;
* ``power``: the share of comparisons of a truly 10 % faster experiment called faster.

    .venv/bin/python tests/benchmarks/verdicts.py [studies]    # default 10000

(tests/test_verdicts.py runs the same code at fewer studies and checks the bounds.)
"""

from __future__ import annotations

import math
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from workflow_scripts.plan.rounds import continuing  # noqa: E402
from workflow_scripts.report.headline import pick, stated_pairs  # noqa: E402
from workflow_scripts.report.uncertainty import (  # noqa: E402
    MARGIN,
    between,
    comparisons_frame,
    with_spread,
)
from workflow_scripts.spec.settings import SETTINGS  # noqa: E402

BASELINE = "baseline"


@dataclass(frozen=True)
class Scenario:
    """A study to simulate: per experiment (the baseline first) its spread of log
    throughput between trials and its true speedup over the baseline."""

    name: str
    spreads: tuple[float, ...]
    speedups: tuple[float, ...]
    #: which experiments' comparisons with the baseline are scored (default: all)
    scored: tuple[int, ...] = ()
    #: the share of trials that a neighbour slows, and by how much (0.15: to 0.85x):
    #: noise with a heavier tail than the log-normal, as a shared machine's
    slowed: tuple[float, float] = (0.0, 0.0)

    @property
    def names(self) -> list[str]:
        return [BASELINE] + [f"e{i}" for i in range(1, len(self.spreads))]


def equal(name: str, k: int, spread: float) -> Scenario:
    """A baseline and ``k`` candidates as fast as it, all at ``spread``."""
    return Scenario(name, (spread,) * (k + 1), (1.0,) * (k + 1))


def mixed(name: str, k: int = 38, noisy: int = 6, quiet: float = 0.03, loud: float = 0.09):
    """One kin of ``k + 1`` experiments as fast as each other, ``noisy`` of them (the
    baseline among them) at ``loud``, the rest at ``quiet``; scored: the noisy pairs."""
    spreads = (loud,) * noisy + (quiet,) * (k + 1 - noisy)
    return Scenario(name, spreads, (1.0,) * (k + 1), tuple(range(1, noisy)))


def slowed(name: str, k: int, spread: float, share: float, by: float) -> Scenario:
    """As :func:`equal`, with ``share`` of all trials slowed by ``by`` (a neighbour)."""
    return Scenario(name, (spread,) * (k + 1), (1.0,) * (k + 1), slowed=(share, by))


def one_faster(name: str, k: int, spread: float, speedup: float) -> Scenario:
    """``k`` candidates, the first ``speedup`` times the baseline, the rest as fast as it;
    scored: the first."""
    return Scenario(name, (spread,) * (k + 1), (1.0, speedup) + (1.0,) * (k - 1), (1,))


def frame_of(names: list[str], trials: dict[str, list[float]], margin: float, looks: int):
    """The statistics frame the report would build from these trials (one kin)."""
    rows = [
        {
            "experiment": n,
            "model": "resnet50",
            "mode": "train",
            "precision": "fp32",
            "threads": 2,
            "ranks": 1,
            "nodes": 1,
            "sps_used": tuple(trials[n]),
            "sps_median": float(np.median(trials[n])),
        }
        for n in names
        if trials[n]
    ]
    return with_spread(pd.DataFrame(rows), margin, looks).set_index("experiment", drop=False)


@dataclass
class Outcome:
    verdicts: list[str] = field(default_factory=list)
    covered: list[bool] = field(default_factory=list)
    crowned: bool = False
    trials: int = 0


def study(
    scenario: Scenario, rng: np.random.Generator, trials: int = 2, max_trials: int = 4,
    margin: float = MARGIN, futility: float = SETTINGS["futility"].default,
) -> Outcome:  # fmt: skip
    """One simulated study, scored as its final report would read (``futility``: the
    least chance of a verdict by ``max_trials`` that another round asks for)."""
    names = scenario.names
    logs = {n: math.log(s) for n, s in zip(names, scenario.speedups, strict=True)}
    sd = dict(zip(names, scenario.spreads, strict=True))
    values: dict[str, list[float]] = {n: [] for n in names}
    looks = max_trials - trials + 1
    ran = names
    for round_ in range(max_trials):
        for n in ran:
            noise = sd[n] * rng.standard_normal()
            if scenario.slowed[0] and rng.random() < scenario.slowed[0]:
                noise += math.log(1 - scenario.slowed[1])
            values[n].append(100.0 * math.exp(logs[n] + noise))
        if round_ < trials - 1:
            continue
        stats = frame_of(names, values, margin, looks)
        rows = dict(zip(stats["experiment"], stats.to_dict("records"), strict=True))
        found = [between(rows[BASELINE], rows[n], "baseline") for n in names[1:]]
        answer = pick(stats, BASELINE)
        if round_ == max_trials - 1:
            break
        pairs = stated_pairs(answer, BASELINE)
        settings = {"trials": trials, "max_trials": max_trials, "futility": futility}
        rows = comparisons_frame(found, pairs).to_dict("records")
        # (any experiment may be named again, also one that sat out a round)
        ran = continuing(rows, names, settings, round_)
        if not ran:
            break
    out = Outcome(trials=sum(len(v) for v in values.values()))
    scored = scenario.scored or range(1, len(names))
    for i in scored:
        c = found[i - 1]
        truth = scenario.speedups[i] / scenario.speedups[0]
        out.verdicts.append(c.verdict)
        out.covered.append(bool(c.ci_low <= truth <= c.ci_high))
    # (the headline crowns its pick, or names another candidate known to beat the baseline)
    out.crowned = answer is not None and (
        (answer.best["experiment"] != BASELINE and answer.crowned)
        or answer.known_faster is not None
    )
    return out


def _outcomes(scenario: Scenario, studies: int, seed: int) -> tuple[list, list, int, int]:
    rng = np.random.default_rng(seed)
    verdicts, covered, crowned, trials = [], [], 0, 0
    for _ in range(studies):
        o = study(scenario, rng)
        verdicts += o.verdicts
        covered += o.covered
        crowned += o.crowned
        trials += o.trials
    return verdicts, covered, crowned, trials


def run(scenario: Scenario, studies: int, seed: int = 20261128, workers: int = 1) -> dict:
    """The scenario's rates over ``studies`` simulated studies (in ``workers``
    processes, each its own seed)."""
    if workers > 1:
        share = [studies // workers + (i < studies % workers) for i in range(workers)]
        with ProcessPoolExecutor(workers) as pool:
            parts = list(
                pool.map(_outcomes, [scenario] * workers, share, [seed + i for i in range(workers)])
            )
    else:
        parts = [_outcomes(scenario, studies, seed)]
    verdicts = [v for p in parts for v in p[0]]
    covered = [c for p in parts for c in p[1]]
    crowned = sum(p[2] for p in parts)
    trials = sum(p[3] for p in parts)
    n = len(verdicts)
    return {
        "scenario": scenario.name,
        "studies": studies,
        "faster": sum(v == "faster" for v in verdicts) / n,
        "slower": sum(v == "slower" for v in verdicts) / n,
        "same": sum(v == "same" for v in verdicts) / n,
        "coverage": sum(covered) / n,
        "crowned": crowned / studies,
        "trials": trials / studies / len(scenario.names),
    }


def scenarios() -> list[Scenario]:
    """The issue's cases: A/A at spreads of 2, 5 and 9 %, a mixed-noise kin, A/A with a
    heavier tail (a neighbour slows one trial in ten), K equal candidates for the
    headline, a true 10 % difference at 5 %."""
    return [
        equal("all equal, 2 %, K=10", 10, 0.02),
        equal("all equal, 5 %, K=26", 26, 0.05),
        equal("all equal, 9 %, K=10", 10, 0.09),
        equal("all equal, 9 %, K=26", 26, 0.09),
        equal("all equal, 9 %, K=40", 40, 0.09),
        mixed("mixed kin: 6 of 39 at 9 %, 33 at 3 %; noisy pairs"),
        slowed("all equal, 5 %, K=10, 1 in 10 trials 15 % slower", 10, 0.05, 0.1, 0.15),
        one_faster("one 10 % faster, 5 %, K=10", 10, 0.05, 1.10),
    ]


def table(results: list[dict]) -> str:
    head = (
        f"{'scenario':<50} {'studies':>7} {'faster':>7} {'slower':>7} {'same':>7} "
        f"{'cover':>7} {'crowned':>8} {'trials':>6}"
    )
    lines = [
        "faster, slower, same: shares of the scored comparisons with the baseline; cover: "
        "of their intervals holding the true ratio; crowned: of the studies whose headline "
        "names a run known to beat the baseline; trials: per experiment, on average",
        "",
    ]
    lines += [head, "-" * len(head)]
    for r in results:
        lines.append(
            f"{r['scenario']:<50} {r['studies']:>7} {100 * r['faster']:>6.2f}% "
            f"{100 * r['slower']:>6.2f}% {100 * r['same']:>6.1f}% {100 * r['coverage']:>6.1f}% "
            f"{100 * r['crowned']:>7.2f}% {r['trials']:>6.2f}"
        )
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    studies = int(argv[0]) if argv else 10_000
    workers = len(os.sched_getaffinity(0))
    results = []
    for s in scenarios():
        start = time.perf_counter()
        results.append(run(s, studies, workers=workers))
        print(f"  {s.name}: {time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
