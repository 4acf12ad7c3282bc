"""A rank's trainer: the model, data, optimizer and backend of a spec, ready to step
(``Trainer``), and Accelerate's side of a rank that ``accelerate launch`` started."""

from __future__ import annotations

import contextlib
import json
import os
import time

from .. import backends, launchers, sysinfo, workloads
from . import schedule
from .distributed import ranks
from .measure import comm_cpu_check


class Trainer:
    """The article's training step (Hugging Face's for a text model), with each
    optimization a switch of the spec."""

    def __init__(self, spec: dict, data_path: str | None = None, out: str | None = None):
        import torch

        from . import data, gradcheck, initial_weights, models, optim, references

        self.spec = spec
        self.torch = torch
        self.workload = workloads.get(spec["model"])
        torch.manual_seed(spec["seed"])
        if spec.get("threads"):  # (less the CPU comm_cpu reserves for communication)
            torch.set_num_threads(int(spec["threads"]) - (1 if spec.get("comm_cpu") else 0))
        self.backend = backends.get(spec["backend"])
        # the backend's libraries, then the model's (the order the model's build took
        # them in): what a fresh process pays before its model exists (a forked one,
        # runtimes/warm.py, holds the model's already), timed apart within the setup
        t0 = time.perf_counter()
        self.backend.setup(spec)
        workloads.import_libraries(workloads.libraries(spec["model"]))
        self.libraries_s = time.perf_counter() - t0
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
        # (its initial weights read where another build of the study drew the same)
        weights = initial_weights.folder(out)
        model, self.weights_read = models.build_from(
            spec["model"], spec.get("attention") or "sdpa", dropout, weights
        )
        self.check = None
        if not self.inference:  # (its references shared with other experiments)
            store = references.Store.for_record(out, spec)
            self.check = gradcheck.GradientCheck(spec, model, rng_state, store, weights)
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
            scales = self.int8_scales()
            model = self.backend.serve(
                model, spec, self.serving["example"], self.serving.pop("calibration"), scales
            )
            self.serving["serve_s"] = time.perf_counter() - t0
            self.serving["int8_calibration"] = scales.done() if scales else None
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
        carried = (spec.get("carried") or {}).get("weights")
        if spec.get("weights_from"):  # trained once in the study, by another run
            info["pretrain"] = inference.load_weights(model, spec, self.out)
        elif carried:  # trained by this experiment's first trial (trial/carry.py)
            info["pretrain"] = inference.load_carried_weights(model, spec, carried)
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

    def int8_scales(self):
        """An INT8 run's calibration: its first trial's, where it carries one (the file
        trial/carry.py checked against that trial's record), else made here and kept
        beside the result for the later trials where the backend keeps one; None for
        any other precision."""
        from . import inference

        if self.spec["precision"] != "int8":
            return None
        carried = (self.spec.get("carried") or {}).get("int8_calibration")
        keeps = self.out and not carried and self.backend.keeps_int8_calibration
        keep = inference.calibration_path(self.out) if keeps else None
        return inference.Int8Scales(carried=carried, keep=keep)

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
            "int8_calibration": info.get("int8_calibration"),
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
