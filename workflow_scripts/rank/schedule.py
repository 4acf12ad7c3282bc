"""When a training of ``epochs`` changes its learning rate and scores its held-out split,
and when a warm-up ends short of ``warmup_steps``.

Pure arithmetic on the spec (no torch), so the loader's tests, the estimate and the
report can use it.
"""

from __future__ import annotations

import math

from .. import backends

#: a run that compiles nothing in its steps ends its warm-up after its first step where
#: that step took this share of ``time_budget_s`` or more (:func:`warmup_ends_after`)
LONG_STEP_SHARE = 0.25


def one_process_lr(spec: dict, world: int) -> float:
    """The learning rate the spec's scaled ``lr`` was scaled from: ``lr / world`` with
    ``batch_scaling: weak`` (the loader multiplied it by the ranks), else ``lr``."""
    return spec["lr"] / world if spec.get("batch_scaling") == "weak" else spec["lr"]


def warmup_steps(spec: dict, steps_per_epoch: int | None) -> int:
    """Optimizer steps of the learning-rate warm-up (0: none)."""
    epochs = spec.get("lr_warmup_epochs") or 0
    return round(epochs * steps_per_epoch) if epochs and steps_per_epoch else 0


def learning_rate(spec: dict, world: int, step: int, steps_per_epoch: int | None) -> float:
    """The rate of optimizer step ``step`` (from 0). The warm-up of Goyal et al. (2017):
    from the one-process rate, rising by the same amount each step, to the scaled ``lr``
    after ``lr_warmup_epochs`` epochs; then ``lr``."""
    n = warmup_steps(spec, steps_per_epoch)
    if step >= n:
        return spec["lr"]
    start = one_process_lr(spec, world)
    return start + (spec["lr"] - start) * step / n


def eval_points(spec: dict, steps_per_epoch: int) -> list[int]:
    """The step counts after which the held-out split is scored: ``evals_per_epoch``
    evenly spaced points per epoch, the last one the end of training."""
    epochs, k = int(spec.get("epochs") or 0), int(spec.get("evals_per_epoch") or 1)
    total = epochs * steps_per_epoch
    points = {round(steps_per_epoch * (e + j / k)) for e in range(epochs) for j in range(1, k + 1)}
    return sorted(p for p in points if 0 < p <= total)


def time_to_accuracy(curve: list[dict], target: float | None) -> float | None:
    """Training time (seconds, scoring excluded) until the held-out accuracy first
    reached ``target``; None without a target or when it was never reached."""
    if target is None:
        return None
    for point in curve:
        if point["test_accuracy"] >= target:
            return point["train_time_s"]
    return None


def _compiled(spec: dict) -> bool:
    return spec.get("compile") not in (None, "none")


def compiles_in_steps(spec: dict) -> bool:
    """Whether the run compiles in its first steps, so that its second step may compile
    again: torch.compile (any backend), XLA (its graph traced in the first steps), a
    TorchScript model (profiled at its first calls)."""
    return (
        _compiled(spec)
        or backends.get(spec["backend"]).estimate_trace_s > 0
        or bool(spec.get("ipex_torchscript"))
    )


def least_warmup(spec: dict) -> int:
    """The fewest warm-up steps a run takes: one (its first step pays its one-off costs);
    two for a compiled training with dropout (its first step runs without dropout, the
    gradient check's, and the second compiles again with it)."""
    redrop = _compiled(spec) and spec.get("dropout") and spec.get("mode", "train") == "train"
    return 2 if redrop else 1


def warmup_enough_s(spec: dict) -> float | None:
    """How long the warm-up's steps may take before it ends short of ``warmup_steps``
    (None: it never does, without a time budget). ``time_budget_s`` for a run that
    compiles in its steps; a quarter of it (:data:`LONG_STEP_SHARE`) for one that does
    not: there the first step pays the one-off costs (allocation, lazy initialisation:
    0.2-1.2 s in every eager record of the budget run on 2 CPUs, 0-2 % of a step from 7 s
    up) and a second warm-up step as long as a quarter of the budget measures nothing
    the timed steps, at most four as long, would not."""
    budget = spec.get("time_budget_s")
    if not budget:
        return None
    return float(budget) * (1.0 if compiles_in_steps(spec) else LONG_STEP_SHARE)


def warmup_ends_after(spec: dict, step_s: float) -> int:
    """How many warm-up steps a run of ``step_s`` a step takes (the estimate's mirror of
    the harness's rule: it ends once its steps took :func:`warmup_enough_s`)."""
    warmup = int(spec.get("warmup_steps") or 0)
    enough = warmup_enough_s(spec)
    if enough is None or not step_s > 0:
        return warmup
    return min(warmup, max(least_warmup(spec), math.ceil(enough / step_s)))
