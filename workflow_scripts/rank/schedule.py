"""When a training of ``epochs`` changes its learning rate and scores its held-out split.

Pure arithmetic on the spec (no torch), so the loader's tests and the report can use it.
"""

from __future__ import annotations


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
