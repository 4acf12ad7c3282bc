"""One training run: build the model and data of a spec, time the steps, write a result.

Runs inside a backend environment (torch, torchvision, maybe IPEX or torch-xla),
in its own process (one per rank), started by its launcher for the trial policy
(``workflow_scripts.trial``). What is specific to a backend (its imports, device,
optimizations, step synchronisation) comes from ``workflow_scripts.backends``;
nothing here knows about processes or containers. Whatever happens
(an exception in setup or in a step), it writes a JSON result with
``status`` ok or failed; a crash that kills the process is recorded by the
launcher instead.

    python -m workflow_scripts.rank.harness --spec-json '{...}' --out result.json [--data-path DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import json
import math
import resource
import sys
import time
import traceback
from pathlib import Path

from .. import backends, launchers, metrics, sysinfo
from ..experiment import Spec
from ..util import SCHEMA_VERSION, write_json_atomic
from . import contention, schedule
from .distributed import ranks
from .measure import (
    achieved_gflops,
    before_steps,
    compile_stats,
    counted_flops,
    probe_or_error,
    text_metrics,
    text_tokens,
)
from .trainer import Trainer


def _rss_mb(who: int) -> float:
    return resource.getrusage(who).ru_maxrss / 1024.0  # ru_maxrss is in KiB on Linux


def curve_point(trainer: Trainer, steps: int, train_time_s: float, scored=None) -> dict:
    """One point of the accuracy curve: the held-out accuracy after ``steps`` optimizer
    steps, and the training time until then (scoring excluded)."""
    scored = scored or trainer.evaluate()
    return {
        "steps": steps,
        "epoch": steps / trainer.batches.steps_per_epoch,
        "train_time_s": train_time_s,
        "test_accuracy": scored["test_accuracy"],
        "test_loss": scored["test_loss"],
        "lr": float(trainer.optimizer.param_groups[0]["lr"]),  # the last step's, applied
    }


def timed_step(trainer: Trainer, i: int, total: int, progress=None) -> tuple[float, float]:
    """Step ``i`` (from 0) of ``total``, timed as every trial times its steps: (seconds,
    loss). The loss is read after the clock stops; a non-finite one ends the run; what
    the step did for the gradient check (``Trainer.inspect``) is taken out of its time."""
    trainer.untimed_s = 0.0
    start = time.perf_counter()
    loss = trainer.step()
    elapsed = time.perf_counter() - start - trainer.untimed_s
    value = trainer.backend.loss_value(loss)
    if not math.isfinite(value):
        raise FloatingPointError(f"loss is {value} at step {i + 1}")
    if progress:
        progress(i + 1, total, elapsed, value)
    return elapsed, value


def progress_printer(rank: int = 0, world: int = 1):
    """The per-step progress line a trial's log shows (on stderr)."""
    who = f"[rank {rank}] " if world > 1 else ""

    def progress(i, total, elapsed, loss):
        # one write per line: the ranks share the launcher's output
        sys.stderr.write(f"{who}step {i}/{total}: {elapsed:.3f} s loss {loss:.4f}\n")
        sys.stderr.flush()

    return progress


@dataclasses.dataclass
class Steps:
    """What the step loop (``run_steps``) produced: the figures of its steps, and why and
    when they ended."""

    total: int  # the steps the loop was to run (max_steps cuts a run short)
    warmup: int = 0  # its untimed steps: warmup_steps, or fewer (short_warmup)
    warmup_s: float = 0.0  # their time
    warmup_times: list[float] = dataclasses.field(default_factory=list)  # each one's
    started: float = math.nan  # its clock (perf_counter) at the first step
    step_times: list[float] = dataclasses.field(default_factory=list)  # the timed steps
    losses: list[float] = dataclasses.field(default_factory=list)  # every step's (warm-up too)
    # a text model's timed steps (text_tokens)
    tokens: list[tuple[int, int, int]] = dataclasses.field(default_factory=list)
    first_step_s: float = math.nan
    # why the timed steps ended: all asked for (or the epochs), the time budget, far from
    # the baseline, or the step time known well enough (early_stop)
    stop_reason: str = "steps"
    compiles_at_first_step: dict | None = None  # compile_stats after the first step
    # scoring during the training (time to accuracy) and the gradient check's work
    # between steps: their time is not training time
    scoring_s: float = 0.0
    checking_s: float = 0.0
    curve: list[dict] = dataclasses.field(default_factory=list)  # the scores while training
    train_time_s: float = math.nan  # the loop's time, less scoring and checking
    # other work on the rank's CPUs from the first timed step to the loop's end
    window_start: dict | None = None  # (contention.snapshot)
    other_work: dict | None = None  # (contention.measure)

    @property
    def budget_hit(self) -> bool:
        return self.stop_reason == "time_budget"

    def training_time(self, now: float) -> float:
        """Training time from the first step until ``now`` (scoring and checking out)."""
        return now - self.started - self.scoring_s - self.checking_s


def train(spec: dict, data_path: str | None = None, progress=None, out: str | None = None) -> dict:
    """Set up and run warm-up + timed steps (or ``epochs`` passes over the data, then
    the held-out accuracy); return the metrics part of a record (with ``probe``, the
    noise probe run just before the steps, or None, and ``gradient_check``)."""
    t0 = time.perf_counter()
    import torch  # noqa: F401 - (import time is reported apart from setup)

    import_s = time.perf_counter() - t0
    launchers.get(spec["launcher"]).verify(spec)
    counted = flops_before_setup(spec)
    t0 = time.perf_counter()
    trainer = Trainer(spec, data_path, out)
    setup_s = time.perf_counter() - t0
    before = before_steps(spec, counted)
    steps = run_steps(trainer, progress)
    after = after_steps(trainer, steps)
    took = {"import_s": import_s, "setup_s": setup_s, "libraries_s": trainer.libraries_s,
            "initial_weights": "read" if trainer.weights_read else "drawn"}  # fmt: skip
    return record_metrics(spec, steps, {**took, **before}, after)


def flops_before_setup(spec: dict) -> dict | None:
    """The FLOP count a trial takes before its setup: the first trial's, carried
    (trial/carry.py), or counted now; None where the backend counts after its setup
    (``before_steps``)."""
    carried = (spec.get("carried") or {}).get("flops_per_sample")
    if carried:
        return {"flops_per_sample": carried, "flops_error": None, "flops_count_s": 0.0}
    if backends.get(spec["backend"]).flops_after_setup:
        return None
    return counted_flops(spec)


def run_steps(trainer: Trainer, progress=None) -> Steps:
    """The warm-up and timed steps (or the epochs' steps, scored along the way), until
    all have run or an early stop (``early_stop``) ends them."""
    spec, epochs = trainer.spec, trainer.epochs
    # max_steps cuts the run short (a pre-flight); the schedule stays the whole run's
    steps = Steps(total=min(trainer.total_steps, spec.get("max_steps") or trainer.total_steps))
    steps.warmup = trainer.warmup_run = spec["warmup_steps"]
    scored_at = set()  # where the training is scored (time to accuracy; the last: after it)
    if epochs:
        steps.stop_reason = "epochs"
        scored_at = set(schedule.eval_points(spec, trainer.batches.steps_per_epoch)[:-1])
    steps.started = time.perf_counter()
    i = 0
    while i < steps.total:
        if i == steps.warmup:  # other work on our CPUs from here: between steps
            steps.window_start = contention.snapshot()
        stop = None if epochs else early_stop(spec, steps.step_times)
        if stop:
            steps.stop_reason = stop
            break
        elapsed, value = checked_step(trainer, i, steps.total, progress)
        steps.checking_s += trainer.untimed_s
        steps.losses.append(value)
        if i == 0:
            steps.first_step_s = elapsed
            steps.compiles_at_first_step = compile_stats(spec)
            if trainer.check is not None:
                trainer.check.first_loss = value
        if i >= steps.warmup:
            steps.step_times.append(elapsed)
            if trainer.workload.text:
                steps.tokens.append(text_tokens(trainer.last[0]))
        elif not epochs:
            steps.warmup_s += elapsed
            steps.warmup_times.append(elapsed)
            if short_warmup(spec, i + 1, steps.warmup_s):
                # the warm-up ends here: the steps it leaves out are not timed either
                steps.total -= steps.warmup - (i + 1)
                steps.warmup = trainer.warmup_run = i + 1
        if i + 1 in scored_at:
            t0 = time.perf_counter()
            steps.curve.append(curve_point(trainer, i + 1, steps.training_time(t0)))
            steps.scoring_s += time.perf_counter() - t0
        i += 1
    steps.train_time_s = steps.training_time(time.perf_counter())
    threads = trainer.torch.get_num_threads()
    steps.other_work = contention.measure(steps.window_start, contention.snapshot(), threads)
    return steps


def short_warmup(spec: dict, done: int, seconds: float) -> bool:
    """Whether the warm-up ends after its first ``done`` steps, short of
    ``warmup_steps``: where they took ``schedule.warmup_enough_s`` already (the time
    budget, or a quarter of it for a run that compiles nothing in its steps: a step that
    slow, bf16 where it is emulated, paid its one-off costs in the first, and a second
    warm-up step of a BERT-base would take minutes more), after
    ``schedule.least_warmup`` steps at least. Every rank decides together."""
    enough = schedule.warmup_enough_s(spec)
    if enough is None or done < schedule.least_warmup(spec) or done >= spec["warmup_steps"]:
        return False
    return ranks.agree(seconds >= enough)


def early_stop(spec: dict, step_times: list[float]) -> str | None:
    """Why the timed steps stop before the next one (None: they go on): the time budget
    spent, the speedup over its baseline already beyond far_stop (plan/far.py: more
    steps change no verdict), or the mean step time known well enough. Every rank
    decides together (``ranks.agree``), with the same calls in the same order."""
    budget, far_from = spec.get("time_budget_s"), spec.get("far_from")
    precision = spec.get("step_precision")
    # far first: where the budget ends the same steps, the record says the trial was far
    # (one trial then decides it: plan/rounds.py)
    if far_from and step_times:
        if not ranks.agree(not metrics.far_beyond(far_from, step_times)):
            return "far_from_baseline"
    if budget and len(step_times) >= min(2, spec["steps"]):
        # enough timed steps for the budget: stop early (all ranks together)
        if ranks.agree(sum(step_times) >= budget):
            return "time_budget"
    if precision and len(step_times) >= metrics.MIN_PRECISION_STEPS:
        if not ranks.agree(not metrics.known_within(step_times, precision)):
            return "precision"
    return None


def checked_step(trainer: Trainer, i: int, total: int, progress=None) -> tuple[float, float]:
    """``timed_step``, with the gradient check's look at the gradients of the first step
    and of the first timed one, and the checked first step without dropout."""
    check = trainer.check
    if check is not None and i in (0, trainer.warmup_run):
        trainer.inspect = functools.partial(check.inspect, trainer.net, i, trainer.warmup_run)
    without_dropout = i == 0 and trainer.checked_without_dropout
    if without_dropout:
        trainer.model.eval()
    elapsed, value = timed_step(trainer, i, total, progress)
    if without_dropout:
        trainer.model.train()
    return elapsed, value


def after_steps(trainer: Trainer, steps: Steps) -> dict:
    """What a trial does after its steps: probe the machine again (all ranks together:
    was it still quiet at the end?), score the trained or served model, read what the
    steps ran with (``checks``) and the run's memory, check the gradients, leave the
    process group."""
    spec = trainer.spec
    ranks.barrier()  # and probe again together: was the machine still quiet at the end?
    # (fp32 alone: the noise signals read fp32; the bf16 rate is the probe before's)
    probe_after = probe_or_error(spec.get("probe_size"), dtypes=("fp32",))
    if not steps.step_times:
        raise RuntimeError(
            f"no timed step ran ({steps.total} steps, of which warm-up {steps.warmup})"
        )
    accuracy = epochs_accuracy(trainer, steps) if trainer.epochs else {}
    checks = trainer.checks()
    checks["compile"] = compile_stats(spec, steps.compiles_at_first_step)
    serving = trainer.served_checks() if trainer.inference else None
    if serving is not None:
        checks["serving"] = serving
        accuracy = {
            "test_accuracy": serving["served_accuracy"],
            "reference_accuracy": serving["reference_accuracy"],
        }
    # the memory of the run, before the gradient check's reference model adds its own
    peak_rss_mb = _rss_mb(resource.RUSAGE_SELF)
    peak_rss_children_mb = _rss_mb(resource.RUSAGE_CHILDREN)
    gradient_check = None
    if trainer.check is not None:
        gradient_check = trainer.check.verdict(trainer.forward_loss, trainer.world)
    ranks.shutdown()
    return {
        "probe_after": probe_after,
        "accuracy": accuracy,
        "checks": checks,
        "peak_rss_mb": peak_rss_mb,
        "peak_rss_children_mb": peak_rss_children_mb,
        "gradient_check": gradient_check,
    }


def epochs_accuracy(trainer: Trainer, steps: Steps) -> dict:
    """A run of ``epochs``: the trained model's held-out accuracy, its accuracy curve
    (the last point: now) and the time it took to reach the target accuracy, with the
    learning rate it trained at."""
    spec = trainer.spec
    final = trainer.evaluate()
    curve = [*steps.curve, curve_point(trainer, steps.total, steps.train_time_s, final)]
    return {
        "epochs": trainer.epochs,
        "steps_per_epoch": trainer.batches.steps_per_epoch,
        "train_samples": steps.total * spec["batch_size"],
        **final,
        "accuracy_curve": curve,
        "scoring_s": steps.scoring_s,
        "target_accuracy": spec["target_accuracy"],
        "time_to_accuracy_s": schedule.time_to_accuracy(curve, spec["target_accuracy"]),
        "learning_rate": {
            "one_process": schedule.one_process_lr(spec, trainer.world),
            "scaled": spec["lr"],
            "warmup_steps": trainer.warmup_steps,
            "schedule": spec["lr_schedule"],
        },
    }


def record_metrics(spec: dict, steps: Steps, before: dict, after: dict) -> dict:
    """The metrics part of a record, from the steps (``run_steps``), what came before
    them (import and setup seconds, ``before_steps``: the FLOP count, the probe) and
    after them (``after_steps``); ``run`` moves the lists, checks and probes out."""
    step_times = steps.step_times
    # this rank's own throughput (the launcher's merge takes the slowest rank per step)
    samples_per_s = metrics.throughput(spec["batch_size"], step_times)
    counted = before["flops_per_sample"]
    text = text_metrics(spec, steps.tokens, counted) if steps.tokens else {}
    flops = text.pop("flops_per_sample", counted)
    gradient_check = after["gradient_check"]
    return {
        "samples_per_s": samples_per_s,
        "flops_per_sample": flops,
        "achieved_gflops": achieved_gflops(flops, samples_per_s),
        "flops_count_s": before["flops_count_s"],
        "flops_error": before["flops_error"],
        **text,
        "steps_timed": len(step_times),
        "warmup_steps_run": steps.warmup,
        # each untimed step's time (the first: time_to_first_step_s), so that whether the
        # warm-up reached a steady step can be read from the records
        "warmup_step_times_s": steps.warmup_times,
        "time_budget_hit": steps.budget_hit,
        "stop_reason": steps.stop_reason,
        "step_time_half_width": metrics.relative_half_width(step_times),
        "step_time_s": metrics.distribution(step_times),
        "time_to_first_step_s": steps.first_step_s,
        "train_time_s": steps.train_time_s,
        **after["accuracy"],
        "setup_s": before["setup_s"],
        "compile_pool_wait_s": before["compile_pool_wait_s"],
        "import_s": before["import_s"],
        # (within setup_s) the backend's and the model's libraries imported
        "libraries_s": before["libraries_s"],
        # (within setup_s) the model's initial weights: drawn, or read where the study
        # kept the same draw (rank/initial_weights.py)
        "initial_weights": before.get("initial_weights"),
        "grad_check_s": gradient_check["check_s"] if gradient_check else None,
        "final_loss": steps.losses[-1],
        "first_loss": steps.losses[0],
        "peak_rss_mb": after["peak_rss_mb"],
        "peak_rss_children_mb": after["peak_rss_children_mb"],
        "step_times_s": step_times,
        "losses": steps.losses,
        "checks": after["checks"],
        "gradient_check": gradient_check,
        "probe": before["probe"],
        "probe_after": after["probe_after"],
        "other_work": steps.other_work,
    }


def run(spec: dict, data_path: str | None = None, progress=None, out: str | None = None) -> dict:
    """A result dict; never raises for a failure of the training itself. A step that did
    not train the whole model, or not as eager does (the gradient check), is status
    ``incorrect``: its figures are kept apart (``unchecked_metrics``), never as a
    throughput."""
    started = sysinfo.now()
    t0 = time.perf_counter()
    result: dict = {"schema_version": SCHEMA_VERSION, "experiment": spec.get("id"), "spec": spec}
    try:
        m = train(spec, data_path, progress, out)
        result["step_times_s"] = m.pop("step_times_s")
        result["losses"] = m.pop("losses")
        result["checks"] = m.pop("checks")
        result["gradient_check"] = m.pop("gradient_check")
        result["probe"] = m.pop("probe")
        result["probe_after"] = m.pop("probe_after")
        result["other_work"] = m.pop("other_work")
        result["metrics"] = m
        result["status"] = "ok"
        result["error"] = None
        verdict = result["gradient_check"]
        if verdict and not verdict["ok"]:
            result["status"] = INCORRECT
            result["unchecked_metrics"] = m
            result["metrics"] = {k: m[k] for k in ("peak_rss_mb", "grad_check_s") if k in m}
            result["error"] = {"type": "IncorrectStep", "message": verdict["problem"]}
    except BaseException as exc:  # noqa: BLE001 - a record must be written whatever happened
        if isinstance(exc, KeyboardInterrupt):
            raise
        result["status"] = "failed"
        result["metrics"] = {"peak_rss_mb": _rss_mb(resource.RUSAGE_SELF)}
        result["error"] = {
            "type": type(exc).__name__,
            "message": str(exc)[:2000],
            "tail": "".join(traceback.format_exception(exc))[-6000:],
        }
    result["metrics"]["wall_s"] = time.perf_counter() - t0
    prov = sysinfo.collect()
    with contextlib.suppress(Exception):
        prov.update(sysinfo.torch_info())
    prov["started_at"] = started
    prov["finished_at"] = sysinfo.now()
    result["provenance"] = prov
    return result


#: the status of a trial whose step did not train what eager trains (gradient check)
INCORRECT = "incorrect"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Run one training experiment and write its result.")
    ap.add_argument("--spec-json", required=True, help="resolved experiment spec as JSON")
    ap.add_argument("--out", required=True, help="result path ({rank}: the rank's number)")
    ap.add_argument(
        "--data-path", default=None, help="the generated image folder or the digits' folder"
    )
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args(argv)
    spec = Spec(json.loads(args.spec_json))

    rank, world, _ = ranks.world()
    progress = None if args.quiet else progress_printer(rank, world)
    result = run(spec, args.data_path, progress, launchers.rank_path(args.out))
    write_json_atomic(Path(launchers.rank_path(args.out)), result)
    if result["status"] != "ok":
        error = result["error"]
        print(error.get("tail") or error["message"], file=sys.stderr)
        if launchers.get(spec["launcher"]).distributed:
            return 1  # the launcher stops the other ranks instead of their waiting for us
    return 0


if __name__ == "__main__":
    sys.exit(main())
