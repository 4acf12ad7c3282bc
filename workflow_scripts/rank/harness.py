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
import os
import resource
import sys
import time
import traceback
from pathlib import Path

from .. import backends, launchers, metrics, sysinfo, workloads
from ..util import SCHEMA_VERSION, write_json_atomic
from . import contention, probe, schedule
from .distributed import ranks


def _rss_mb(who: int) -> float:
    return resource.getrusage(who).ru_maxrss / 1024.0  # ru_maxrss is in KiB on Linux


class Trainer:
    """The article's training step (Hugging Face's for a text model), with each
    optimization a switch of the spec."""

    def __init__(self, spec: dict, data_path: str | None = None, out: str | None = None):
        import torch

        from . import data, gradcheck, models, optim

        self.spec = spec
        self.torch = torch
        self.workload = workloads.get(spec["model"])
        torch.manual_seed(spec["seed"])
        if spec.get("threads"):  # (less the CPU comm_cpu reserves for communication)
            torch.set_num_threads(int(spec["threads"]) - (1 if spec.get("comm_cpu") else 0))
        self.backend = backends.get(spec["backend"])
        self.backend.setup(spec)
        self.device = self.backend.device()
        # a rank of a data-parallel trial: its process group, and its share of the batch
        self.group = None
        self.rank, self.world = 0, 1
        self.accelerator = None
        launcher = launchers.get(spec["launcher"])
        if launcher.trains_with_accelerate:
            self.accelerator, self.group = accelerator(spec)
            self.rank = self.accelerator.process_index
            self.world = self.accelerator.num_processes
        elif launcher.distributed:
            self.group = ranks.init_process_group(spec)
            self.rank, self.world, _ = ranks.world()

        self.inference = spec["mode"] == "inference"
        rng_state = torch.get_rng_state()  # what the gradient check rebuilds the model from
        dropout = bool(spec.get("dropout")) and self.workload.text
        model = models.build(
            spec["model"], attention=spec.get("attention") or "sdpa", dropout=dropout
        )
        self.check = None if self.inference else gradcheck.GradientCheck(spec, model, rng_state)
        # the checked step (the first) runs without dropout, as its references do (eval
        # mode: a transformer has no batch norm, so only dropout differs)
        self.checked_without_dropout = dropout and self.check is not None
        model.train(not self.inference)
        cl = torch.channels_last
        self.memory_format = cl if spec["channels_last"] else torch.contiguous_format
        if spec["channels_last"]:
            model = model.to(memory_format=torch.channels_last)
        model = model.to(self.device)
        self.data_path = data_path
        self.out = out  # the rank's result path: a served model's weights go beside it
        self.batches = data.batches(spec, data_path, self.rank, self.world)
        # the epochs this run trains for its timed steps (an inference run's train first)
        self.epochs = epochs = 0 if self.inference else spec.get("epochs") or 0
        spe = self.batches.steps_per_epoch
        self.total_steps = epochs * spe if epochs else spec["warmup_steps"] + spec["steps"]
        optimizer = None if self.inference else optim.build(model.parameters(), spec)
        self.bf16 = spec["precision"] == "bf16"
        self.serving = None
        if self.inference:  # the model as a server calls it (trained first with epochs)
            model, self.serving = self.served(model)
        model, optimizer = self.backend.prepare(model, optimizer, spec)
        if self.inference:  # the backend's serving path (INT8, TorchScript)
            t0 = time.perf_counter()
            model = self.backend.serve(
                model, spec, self.serving["example"], self.serving.pop("calibration")
            )
            self.serving["serve_s"] = time.perf_counter() - t0
        scheduler = None if self.inference else optim.scheduler(optimizer, spec, self.total_steps)
        self.net = model  # before DDP and compile: what evaluate() scores
        if self.accelerator is not None:
            # Accelerate's own: DDP over its process group, its autocast on the forward,
            # ipex.optimize with the legacy ipex_config, its scheduler wrapper
            prepared = [x for x in (model, optimizer, scheduler) if x is not None]
            prepared = self.accelerator.prepare(*prepared)
            model, optimizer = prepared[0], (prepared[1] if optimizer is not None else None)
            scheduler = prepared[2] if scheduler is not None else None
            self.net = self.accelerator.unwrap_model(model)
        elif self.group is not None:
            # DDP inside torch.compile, as PyTorch recommends (its DDPOptimizer splits
            # the graph at the gradient buckets)
            model = torch.nn.parallel.DistributedDataParallel(model)
        model = self.backend.compile(model, spec)
        self.model = model
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.loss_fn = torch.nn.CrossEntropyLoss()  # a vision model's (text: the model's own)
        self.steps_done = 0
        # where the step clears the gradients: as its family's users do (the article's
        # loop first, Hugging Face's examples after the optimizer and schedule steps; the
        # allocator's work differs: freeing them last cost BERT-base 2.6x the page faults
        # and 5 % of its step here)
        self.zero_grad_last = workloads.ZERO_GRAD_LAST[self.workload.family]
        # called inside the step once, between the optimizer step and clearing the
        # gradients (the gradient check), its seconds in untimed_s
        self.inspect = None
        self.untimed_s = 0.0
        # the learning rate's warm-up steps; the untimed ones this run took (run_steps)
        self.warmup_steps = schedule.warmup_steps(spec, spe)
        self.warmup_run = spec["warmup_steps"]
        # (a hook inside a compiled graph would change the graph; a TorchScript or
        # quantized graph module has none to hook)
        plain = spec["compile"] == "none" and spec["precision"] != "int8"
        plain = plain and not isinstance(self.net, torch.jit.ScriptModule)
        self.dtype_seen = _dtype_probe(self.net) if plain else None
        if spec["channels_last"] and self.batches.cycle is not None:
            # the synthetic batches, in channels_last once (a step's own copy into it is
            # then a no-op), as a hand-written loop would hold them
            self.batches = data.Batches(
                None, cycle=[(x.contiguous(memory_format=cl), y) for x, y in self.batches.cycle]
            )

    def served(self, model):
        """Inference: the model as a server calls it (``inference.served``), trained first
        for ``epochs`` on its data's training split (fp32 eager), and what the served
        model will be held against: the fp32 eager logits of the run's first batch and,
        for a trained model, its held-out accuracy; with the INT8 calibration batches."""
        from . import data, inference

        spec, torch = self.spec, self.torch
        info: dict = {"pretrain": None, "reference_accuracy": None}
        info["weight_layers"] = inference.weight_layers(model)
        if spec.get("weights_from"):  # trained once in the study, by another run
            info["pretrain"] = inference.load_weights(model, spec, self.out)
        elif spec.get("epochs"):  # on a stream of its own: the timed steps see the same
            # batches whether the run trained its weights or loaded them
            own = data.batches(spec, self.data_path)
            info["pretrain"] = inference.pretrain(spec, model, own, self.workload)
            if self.out:  # for the runs that serve the same weights (weights_from)
                info["pretrain"].update(inference.save_weights(model, self.out))
        model.eval()
        net = inference.served(self.workload, model)

        def batch(source):
            x, _ = next(source)
            if self.spec["channels_last"]:
                x = x.contiguous(memory_format=torch.channels_last)
            return inference.inputs(x)

        info["example"] = batch(self.batches)
        with torch.inference_mode():
            info["reference_logits"] = net(*info["example"]).float()
        if spec.get("epochs"):
            info["reference_accuracy"] = self.score(net)
        # the calibration: the first batches of the run's data, from a stream of their
        # own (the timed steps see the same batches with or without a calibration)
        n = inference.CALIBRATION_BATCHES if spec["precision"] == "int8" else 0
        own = data.batches(spec, self.data_path) if n else None
        info["calibration"] = [batch(own) for _ in range(n)]
        return net, info

    def score(self, net) -> float:
        """Held-out accuracy of a served model, called at the run's own batch shape."""
        from . import data, inference

        held = data.held_out(self.spec, self.data_path)
        return inference.score(net, held, self.spec["batch_size"], self.spec["channels_last"])

    def served_checks(self) -> dict:
        """After the timed steps (untimed): the served model's logits on the first batch
        against fp32 eager's, its held-out accuracy (a model trained by the run), the
        oneDNN kernels one forward pass ran (data types, ISA)."""
        from . import inference

        torch, info = self.torch, self.serving
        example = info["example"]
        served: list = []

        def forward():
            with torch.inference_mode(), self.autocast():
                served.append(self.model(*example))

        # one forward pass gives both its logits and the oneDNN kernels it ran (where
        # bf16 is emulated, a forward pass of BERT-base at batch 16 took 2.5 min)
        lines = inference.onednn_trace(forward, self.backend.onednn_verbose())
        out = {
            "agreement": inference.agreement(info["reference_logits"], served[0]),
            "serve_s": info["serve_s"],
            "int8": self.backend.int8 if self.spec["precision"] == "int8" else None,
            "pretrain": info["pretrain"],
            "weight_layers": info["weight_layers"],
            "reference_accuracy": info["reference_accuracy"],
            "served_accuracy": None,
        }
        out["onednn"] = inference.kernels(lines)
        if info["reference_accuracy"] is not None:
            with self.autocast():
                out["served_accuracy"] = self.score(self.model)
        return out

    def autocast(self):
        if self.accelerator is not None:
            return self.accelerator.autocast()
        if not self.bf16:
            return contextlib.nullcontext()
        return self.torch.autocast("cpu", dtype=self.torch.bfloat16)

    def forward_loss(self, model, x, y):
        from . import models

        return models.forward_loss(self.workload, model, x, y, self.loss_fn)

    def step(self):
        x, y = next(self.batches)
        if self.steps_done == 0 and self.check is not None:
            self.check.keep_batch(x, y)
        if self.spec["channels_last"]:
            x = x.contiguous(memory_format=self.memory_format)
        x, y = self.backend.to_device(x, y)
        if self.inference:
            return self.forward(x, y)
        if not self.zero_grad_last:
            self.optimizer.zero_grad(set_to_none=True)
        with self.autocast():
            out, loss = self.forward_loss(self.model, x, y)
        if self.accelerator is not None:
            self.accelerator.backward(loss)
        else:
            loss.backward()
        # the weak-scaling warm-up, and the first step after it (the full rate); without
        # one the optimizer's rate is left as the backend prepared it
        if self.warmup_steps and self.steps_done <= self.warmup_steps:
            lr = self.learning_rate(self.steps_done)
            for group in self.optimizer.param_groups:
                group["lr"] = lr
        self.steps_done += 1
        self.optimizer.step()
        if self.scheduler is not None:
            self.scheduler.step()
        self.backend.sync()
        if self.inspect is not None:  # a look at this step's gradients, not timed
            t0 = time.perf_counter()
            self.inspect()
            self.inspect = None
            self.untimed_s += time.perf_counter() - t0
        if self.zero_grad_last:
            self.optimizer.zero_grad(set_to_none=True)
        # the batch and the outputs' dtype, not the outputs: a tensor kept across steps
        # changes what the allocator returns to the system (here 13 % more page faults
        # and 3.5 % more time in a BERT-base step than a loop that keeps none)
        self.last = (x, out.dtype)
        return loss.detach()

    def learning_rate(self, step: int) -> float:
        return schedule.learning_rate(self.spec, self.world, step, self.batches.steps_per_epoch)

    def forward(self, x, y):
        """An inference step: the forward pass alone, under ``torch.inference_mode``
        (its loss, on the batch's labels, is only a sign of what the model computed)."""
        from . import inference

        with self.torch.inference_mode(), self.autocast():
            out = self.model(*inference.inputs(x))
            loss = inference.loss_of(self.workload, out, y)
        self.backend.sync()
        self.last = (x, out.dtype)
        return loss

    def evaluate(self) -> dict:
        """Held-out accuracy and loss of the trained model on its data's test split
        (digits or keywords; every rank scores the whole split with its own copy: DDP
        keeps them equal)."""
        torch = self.torch
        from . import data, models

        correct, loss_sum, n = 0, 0.0, 0
        self.net.eval()
        with torch.no_grad(), self.autocast():
            for x, y in data.held_out(self.spec, self.data_path):
                if self.spec["channels_last"]:
                    x = x.contiguous(memory_format=self.memory_format)
                x, y = self.backend.to_device(x, y)
                out = models.logits(self.workload, self.net, x).float()
                loss_sum += float(torch.nn.functional.cross_entropy(out, y, reduction="sum"))
                correct += int((out.argmax(dim=1) == y).sum())
                n += len(y)
        self.net.train()
        return {"test_accuracy": correct / n, "test_loss": loss_sum / n, "test_samples": n}

    def checks(self) -> dict:
        """What the last step really ran with (dtype, memory format, compilation)."""
        from . import optim

        torch = self.torch
        x, out_dtype = self.last
        images = not isinstance(x, dict)
        seen = self.dtype_seen or {}
        weights = [p for p in self.model.parameters() if p.dim() == 4]
        cl = torch.channels_last
        return {
            # where autocast runs: inside the model (Accelerate converts a forward's
            # outputs back to fp32 after it), else the logits the step computed
            "output_dtype": str(seen.get("dtype") or out_dtype).replace("torch.", ""),
            "output_dtype_of": seen.get("module") or "logits",
            "input_channels_last": bool(
                images and x.dim() == 4 and x.is_contiguous(memory_format=cl)
            ),
            "weights_channels_last": bool(weights)
            and all(w.is_contiguous(memory_format=cl) for w in weights),
            "compiled": type(self.model).__name__ == "OptimizedModule",
            "device": str((x["input_ids"] if not images else x).device),
            "dataloader_workers": self.spec["num_workers"]
            if self.spec["data"] != "synthetic"
            else 0,
            "threads": torch.get_num_threads(),
            "cpus": sysinfo.cpu_list_str(sorted(os.sched_getaffinity(0))),
            "placement": ranks.placement(sorted(os.sched_getaffinity(0)), sysinfo.cpu_topology()),
            "comm_cpu": comm_cpu_check(self.spec),
            "world_size": self.world,
            **(
                {
                    "optimizer": optim.describe(self.optimizer),
                    "lr_schedule": self.spec["lr_schedule"],
                    "last_lr": float(self.optimizer.param_groups[0]["lr"]),
                }
                if self.optimizer is not None
                else {}
            ),
            **({"attention": self.spec.get("attention")} if not images else {}),
            **(
                {
                    "dist_backend": self.group["dist_backend"],
                    "ccl": self.group["ccl"],
                    "ccl_config": self.group.get("ccl_config"),
                    "address": self.group.get("address"),
                }
                if self.group
                else {}
            ),
            **({"accelerate": accelerate_checks(self.accelerator)} if self.accelerator else {}),
        }


def _dtype_probe(net) -> dict:
    """The dtype the model's last layer with weights of its own computes in, read by a
    forward hook inside the model (where autocast runs; Accelerate converts a forward's
    outputs to fp32 after it), on the first forward pass (then the hook is removed).
    For an eager model only: a hook inside a compiled graph would change the graph."""
    seen: dict = {}
    last = None
    for name, module in net.named_modules():
        if any(True for _ in module.parameters(recurse=False)):
            last = (name, module)
    if last is None:
        return seen

    def hook(module, args, output):
        out = output[0] if isinstance(output, tuple) else output
        seen.update(module=last[0], dtype=getattr(out, "dtype", None))
        handle.remove()

    handle = last[1].register_forward_hook(hook)
    return seen


def accelerator(spec: dict):
    """The ``Accelerator`` of a rank that ``accelerate launch`` started (its settings
    from the config file, through the launcher's environment), and the process group
    it trains over (None for one process). Accelerate joins a gloo group itself, with
    the study's timeout; a ccl group is joined first, and Accelerate adopts it."""
    import datetime

    from accelerate import Accelerator
    from accelerate.utils import InitProcessGroupKwargs

    _, world, _ = ranks.world()
    joined = None
    if world > 1 and spec["dist_backend"] != "gloo":
        joined = ranks.init_process_group(spec)
    timeout = datetime.timedelta(seconds=ranks.pg_timeout_s(spec))
    acc = Accelerator(cpu=True, kwargs_handlers=[InitProcessGroupKwargs(timeout=timeout)])
    want = "bf16" if spec["precision"] == "bf16" else "no"
    if str(acc.mixed_precision) != want:
        raise RuntimeError(
            f"Accelerate runs mixed_precision {acc.mixed_precision!r}, the spec asks {want!r} "
            f"(precision {spec['precision']!r})"
        )
    group = None
    if acc.num_processes > 1:
        import torch.distributed as dist

        group = {
            "dist_backend": dist.get_backend(),
            "world_size": dist.get_world_size(),
            "pg_timeout_s": (joined or {}).get("pg_timeout_s", timeout.total_seconds()),
            "ccl": (joined or {}).get("ccl"),
            "ccl_config": (joined or {}).get("ccl_config"),
        }
    return acc, group


def accelerate_checks(acc) -> dict:
    """What Accelerate ran with: the launch command and config file (from the launch
    wrapper), and its state's view."""
    launch = json.loads(os.environ.get("STUDY_ACCELERATE_LAUNCH") or "{}")
    state = acc.state
    return {
        "command": launch.get("command"),
        "config": launch.get("config"),
        "distributed_type": str(state.distributed_type).split(".")[-1],
        "backend": state.backend,
        "num_processes": state.num_processes,
        "mixed_precision": str(acc.mixed_precision),
        "use_ipex": bool(getattr(state, "use_ipex", False)),
    }


def count_flops_per_sample(spec: dict) -> float:
    """FLOPs of one step per sample: one forward + backward at batch size 1 (inference:
    the forward alone).

    Counted with ``torch.utils.flop_counter.FlopCounterMode`` (2 FLOPs per
    multiply-add of the matmuls and convolutions, the bulk of the work; norms and
    activations are not counted) on a fresh CPU copy of the model built with the
    spec's seed, before any compile or ``ipex.optimize`` (a transformer with plain-matmul
    attention: the counter does not see inside the CPU's fused attention kernel, whose
    FLOPs are the same). Eval mode: batch norm with one sample fails in training mode
    on small images, and its FLOPs are not counted anyway. The global RNG is left as
    it was.
    """
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from . import data, models

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(spec["seed"])
        w = workloads.get(spec["model"])
        model = models.build(spec["model"], attention="eager")
        model.eval()
        x, y = data.synthetic_batch(
            {**spec, "padding": "fixed"}, 1, torch.Generator().manual_seed(spec["seed"])
        )
        counter = FlopCounterMode(display=False)
        with counter:
            _, loss = models.forward_loss(w, model, x, y)
            if spec["mode"] == "train":
                loss.backward()
    return float(counter.get_total_flops())


def achieved_gflops(flops_per_sample: float | None, samples_per_s: float) -> float | None:
    """GFLOP/s the timed steps computed (their share of the machine's calibrated matmul
    ceiling, ``pct_of_peak``, is the trial policy's: the calibration is its input)."""
    ok = flops_per_sample is not None and math.isfinite(samples_per_s)
    return flops_per_sample * samples_per_s / 1e9 if ok else None


def probe_or_error(size, dtypes: tuple[str, ...] = probe.DTYPES) -> dict | None:
    """The noise probe in this process now (None when the spec has none); a probe that
    fails must not fail the run."""
    if not size:
        return None
    try:
        return probe.run(int(size), dtypes=dtypes)
    except Exception as exc:  # noqa: BLE001
        return {"error": f"{type(exc).__name__}: {exc}"[:500]}


def counted_flops(spec: dict) -> dict:
    """The FLOP count of the spec's model (``flops_per_sample``, or ``flops_error`` when
    it could not be counted) and how long counting took."""
    t0 = time.perf_counter()
    flops_error = None
    try:
        flops = count_flops_per_sample(spec)
    except Exception as exc:  # noqa: BLE001 - a missing FLOP count must not fail the run
        flops, flops_error = None, f"{type(exc).__name__}: {exc}"[:500]
    return {
        "flops_per_sample": flops,
        "flops_error": flops_error,
        "flops_count_s": time.perf_counter() - t0,
    }


def before_steps(spec: dict, counted: dict | None) -> dict:
    """What a trial does between its setup and its steps: wait for its own compile
    worker pool, count the FLOPs (unless ``counted`` before the setup), probe the
    machine (all ranks together)."""
    # The trial's own background work first: a compile worker pool that the setup
    # started (IPEX's import does) would share the cores with the probe and steps.
    try:
        pool_wait_s = probe.wait_for_compile_pool()
    except Exception:  # noqa: BLE001 - a pool that failed to start shows up in a compile
        pool_wait_s = None
    # After the setup where the backend needs it (torch_xla claims its device before
    # any backward in the process), before the steps; neither is part of setup_s.
    counted = counted or counted_flops(spec)
    ranks.barrier()  # the ranks probe together, and step together after
    probe_result = probe_or_error(spec.get("probe_size"))
    ranks.barrier()
    return {"compile_pool_wait_s": pool_wait_s, **counted, "probe": probe_result}


def comm_cpu_check(spec: dict) -> dict | None:
    """With ``comm_cpu``: the CPU reserved for communication and the threads found pinned
    to it alone (oneCCL's worker), read from /proc after the steps."""
    if not spec.get("comm_cpu"):
        return None
    reserved = os.environ.get(ranks.RESERVED_VAR)
    threads = sysinfo.thread_cpus()
    return {
        "reserved": int(reserved) if reserved and reserved.isdigit() else reserved,
        "threads_on_it": [t["name"] for t in threads if t["cpus"] == reserved],
        "threads": len(threads),
    }


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
    return record_metrics(spec, steps, {"import_s": import_s, "setup_s": setup_s, **before}, after)


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
    ``warmup_steps``: where they took ``time_budget_s`` already (a step that slow, bf16
    where it is emulated, 40x fp32's, paid its one-off costs in the first, and a second
    warm-up step of a BERT-base would take minutes more), after one step at least (two
    for a compiled run with dropout: its first runs without dropout, the gradient
    check's, and the second compiles again with it). Every rank decides together."""
    budget = spec.get("time_budget_s")
    compiled = spec.get("compile") not in (None, "none")
    redrop = compiled and spec.get("dropout") and spec.get("mode", "train") == "train"
    if not budget or done < (2 if redrop else 1) or done >= spec["warmup_steps"]:
        return False
    return ranks.agree(seconds >= budget)


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


def text_tokens(x: dict) -> tuple[int, int, int]:
    """(real tokens, samples, padded length) of a text batch."""
    mask = x["attention_mask"]
    return int(mask.sum()), int(mask.shape[0]), int(mask.shape[1])


def text_metrics(spec: dict, tokens: list[tuple[int, int, int]], counted: float | None) -> dict:
    """A text model's tokens per sample over the timed steps (the real ones, and with
    the pads it computed on); with dynamic padding, its FLOPs per sample at the lengths
    the batches were padded to: the count at ``seq_len`` times the mean, over the timed
    steps, of the model's FLOPs at the step's padded length over its FLOPs at
    ``seq_len`` (``workloads.Workload.forward_flops``)."""
    samples = sum(n for _, n, _ in tokens)
    out = {
        "tokens_per_sample": sum(real for real, _, _ in tokens) / samples,
        "padded_tokens_per_sample": sum(n * width for _, n, width in tokens) / samples,
    }
    if counted is not None and spec.get("padding") == "dynamic":
        w = workloads.get(spec["model"])
        full = w.forward_flops(spec)
        scale = [w.forward_flops({**spec, "seq_len": width}) / full for _, _, width in tokens]
        out["flops_per_sample"] = counted * sum(scale) / len(scale)
    return out


def compile_stats(spec: dict, at_first_step: dict | None = None) -> dict | None:
    """torch.compile's work so far in this process (None without a compile): the graphs
    it made, its frame compilations and their seconds (Dynamo's and the backward's), its
    compile caches' hits and misses (Inductor's FX graphs, AOTAutograd's);
    with ``at_first_step``, also what it compiled after the first step (recompilations
    for new shapes, e.g. dynamically padded batches)."""
    if spec["compile"] == "none":
        return None
    try:
        from torch._dynamo.utils import compilation_time_metrics, counters
    except ImportError:
        return None
    frames = compilation_time_metrics.get("_compile.compile_inner", [])
    backward = compilation_time_metrics.get("compile_fx.<locals>.bw_compiler", [])
    out = {
        "graphs": int(counters["stats"].get("unique_graphs", 0)),
        "frame_compiles": len(frames),
        "backward_compiles": len(backward),
        "compile_s": float(sum(frames) + sum(backward)),
        # what came from the compile cache (a later trial's: its first trial's, carry.py)
        "cache": {
            f"{key}_{what}": int(counters[section].get(f"{key}_{what}", 0))
            for section, key in (("inductor", "fxgraph_cache"), ("aot_autograd", "autograd_cache"))
            for what in ("hit", "miss")
        },
    }
    if at_first_step:
        out["recompiles_after_first_step"] = out["frame_compiles"] - at_first_step["frame_compiles"]
        out["compile_s_after_first_step"] = out["compile_s"] - at_first_step["compile_s"]
    return out


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
    spec = json.loads(args.spec_json)

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
