"""Did the step train the whole model, and as eager PyTorch trains it? Checked on every
training trial, outside its timed steps.

Two checks, after PyTorch's own compiled-model benchmark runner in its training accuracy
mode (``benchmarks/dynamo/common.py``):

1. **Every parameter got a gradient.** After the first step and after the first timed
   step, every parameter that requires one must hold a finite, non-zero gradient
   (:func:`received`). A step whose backward skips part of the model (a compiled graph
   that cut the autograd path, a detached block) trains only the rest, and runs
   "faster" for it.
2. **The gradients are eager's.** For every rung that is not plain fp32 eager PyTorch in
   one process (:func:`needs_reference`: torch.compile with any backend,
   ``ipex.optimize``, XLA, bf16, data-parallel ranks, Accelerate), the first step's loss
   and per-parameter gradients are compared with eager PyTorch's from the same initial
   weights on the same batch. As in the dynamo runner, two references: **fp64 eager**,
   the truth, and **eager at the run's own precision** (fp32, or bf16 autocast; with
   the weights in bf16 too where the backend holds them so, as ``ipex.optimize`` in
   bf16 does: :func:`own_weights_dtype`), whose distance from the truth is what that
   precision costs on this model and batch. A parameter's relative error
   ``||g - g64|| / ||g64||`` may be :data:`MULTIPLIER` times eager's own (or the median
   over the parameters of eager's, when larger) plus :data:`FLOOR` of the precision; a
   small tensor's :data:`SMALL_TENSOR_MULTIPLIERS` times, as the runner allows where
   noise dominates a small tensor's error. The own-precision reference is what makes
   the check fair: a randomly initialised ResNet-50's backward amplifies rounding so much that
   fp32 with 1 thread and with 2 differs by ~1 % per parameter, and bf16 autocast's
   gradients are ~130 % away from fp32's (both measured here), while a backward that
   lost a layer is ~100 % away in fp32. Plain eager at its precision (e.g. the bf16
   rung) is its own second reference: its distance from fp64 is recorded, and only its
   loss is judged. A parameter whose fp64 gradient is negligible (:data:`NEGLIGIBLE` of
   the largest; e.g. BERT's attention key bias, whose true gradient is zero) needs
   only be finite.

The references are rebuilt after the timed steps from the random-number state the run's
model was built from (their parameters' checksums must match the run's initial ones),
in the run's memory format, and with several ranks their gradients are averaged over
the ranks in a Gloo group of their own, as DDP averages the run's. The run's gradients
are read inside its step, between the optimizer step and clearing them (the harness
takes that time out of the step's), and the first step's wait in a temporary file; the
peak RSS a trial reports is read before the references are built: neither the check's
memory nor its time touches the measurement. Its cost, ``check_s``, is recorded.
"""

from __future__ import annotations

import math
import os
import shutil
import tempfile
import time
import weakref

#: a parameter's error against fp64 may be this many times eager's own at the precision
MULTIPLIER = 3.0
#: ... or more for a small tensor, whose error noise dominates (as PyTorch's runner with
#: use_larger_multiplier_for_smaller_tensor): (most values, multiplier), smallest first.
#: ResNet-50's batch-norm parameters (64-128 values) are 2.5 % from fp64 in eager fp32
#: and 3.1x that through XLA, whose reductions run in another order (measured here)
SMALL_TENSOR_MULTIPLIERS = ((10, 10.0), (500, 8.0))
#: ... plus this much (relative), per precision
FLOOR = {"fp32": 1e-4, "bf16": 1e-2}
#: the first step's loss against fp64 eager's, relative, per precision
LOSS_TOLERANCE = {"fp32": 1e-3, "bf16": 0.05}
#: an fp64 gradient this small against the largest parameter's is noise: its parameter
#: is only required to be finite (a zero there is no lost gradient)
NEGLIGIBLE = 1e-6
#: how many parameter names a message or a record's list shows
NAMES_SHOWN = 8
#: how a parameter can come out of a step without a usable gradient
LOST_KINDS = {
    "without_gradient": "no gradient",
    "zero_gradient": "an all-zero gradient",
    "nonfinite_gradient": "a non-finite gradient",
}


def plain_eager(spec: dict) -> bool:
    """Eager PyTorch's own kernels in one process (any memory format, any allocator):
    no compile, no ``ipex.optimize``, no XLA, no data-parallel ranks or Accelerate."""
    return (
        spec["compile"] == "none"
        and not spec.get("ipex_optimize")
        and spec["backend"] != "xla"
        and spec["launcher"] in ("none", "run_cpu")
    )


def own_weights_dtype(spec: dict) -> str:
    """The dtype the run holds its weights in (its backend says): ``bf16`` where
    ``ipex.optimize`` casts them, whose gradients are then those of a bf16 model (10x
    bf16 autocast's error on BERT's LayerNorm biases, measured here), not a wrong step."""
    from ..backends import get

    return get(spec["backend"]).weights_dtype(spec)


def needs_reference(spec: dict) -> bool:
    """Whether the spec's step is compared with references (plain fp32 eager in one
    process is the reference itself)."""
    return spec["precision"] != "fp32" or not plain_eager(spec)


def reference_kinds(spec: dict) -> list[str]:
    """The references a spec's full check makes, by kind (references.py): fp64 eager's,
    and eager's at the run's precision where the run is not plain eager; none where
    the run is its own reference or serves."""
    from . import references

    if not references.shares(spec) or not needs_reference(spec):
        return []
    kinds = ["fp64"]
    if not plain_eager(spec):
        own = "bf16" if spec["precision"] == "bf16" else "fp32"
        kinds.append(references.kind(own, own_weights_dtype(spec) == "bf16"))
    return kinds


def trainable(net) -> list:
    """(name, parameter) of every parameter that requires a gradient and holds values
    (IPEX's packed modules add empty placeholders)."""
    return [(n, p) for n, p in net.named_parameters() if p.requires_grad and p.numel() > 0]


def _packed(net) -> dict:
    """IPEX's packed modules: their weight's name -> the module (whose ``ctx.to_public``
    turns the packed layout back into torch's)."""
    out = {}
    for name, module in net.named_modules():
        ctx = getattr(module, "ctx", None)
        weight = getattr(module, "weight", None)
        if ctx is not None and hasattr(ctx, "to_public") and weight is not None:
            out[f"{name}.weight" if name else "weight"] = module
    return out


def public_gradients(net) -> dict:
    """Every trainable parameter's gradient on the CPU in torch's own layout (None where
    it has none)."""
    packed = _packed(net)
    out = {}
    for name, p in trainable(net):
        g = p.grad
        if g is not None:
            g = g.detach()
            if name in packed:
                g = packed[name].ctx.to_public(g)
            g = g.cpu() if g.device.type != "cpu" else g
        out[name] = g
    return out


def summary(grads: dict) -> dict:
    """Of gradients by parameter name: how many are usable (finite, not all zeros), and
    the names of the others."""
    import torch

    lost: dict[str, list[str]] = {key: [] for key in LOST_KINDS}
    for name, g in grads.items():
        if g is None:
            lost["without_gradient"].append(name)
        elif not bool(torch.isfinite(g).all()):
            lost["nonfinite_gradient"].append(name)
        elif not bool(g.count_nonzero()):
            lost["zero_gradient"].append(name)
    return {
        "parameters": len(grads),
        "with_gradient": len(grads) - sum(len(v) for v in lost.values()),
        **lost,
    }


def received(net) -> dict:
    """Which trainable parameters hold a finite, non-zero gradient now: counts and the
    names of those that do not."""
    return summary({name: p.grad for name, p in trainable(net)})


#: elements a checksum converts to float64 at a time: 64 KB, below glibc's smallest mmap
#: threshold (128 KB), so that it is served from the heap and never moves the threshold
CHECKSUM_CHUNK = 8192


def checksum(net) -> dict:
    """Each parameter's sum (float64, chunk by chunk): equal for the same initial weights.

    Taken before the steps, so it leaves glibc's allocator as it found it: a whole
    parameter converted to float64 (up to 19 MB for ResNet-50's largest) raised its mmap
    threshold, and the trial's steps then faulted less than a user's loop's
    (tests/test_harness.py)."""
    return {
        n: math.fsum(float(c.double().sum()) for c in p.detach().reshape(-1).split(CHECKSUM_CHUNK))
        for n, p in net.named_parameters()
    }


class GradientCheck:
    """One trial's check: made right after its model is built (before any backend,
    compile or data-parallel wrapper touches it), fed the first batch, the gradients
    after the first step and the first timed step, and asked for its verdict at the end
    (every rank together)."""

    def __init__(self, spec: dict, model, rng_state, store=None, weights=None):
        self.spec = spec
        self.weights = weights  # the study's initial weights (initial_weights.folder)
        # where the references other experiments made for the same step are (None: made
        # here, kept for nobody): references.Store
        self.store = store
        self.shared: dict[str, str] = {}  # a reference's kind -> the experiment that made it
        self.rng_state = rng_state  # torch's CPU generator just before the model was built
        self.initial = checksum(model)
        # a later trial whose first trial's comparison passed carries it (trial/carry.py):
        # its own step is still checked for gradients received, with the first's
        # negligible parameters
        self.carried = spec.get("carried") or {}
        self.reference = needs_reference(spec) and "negligible" not in self.carried
        self.batch = None
        self.first_loss: float | None = None
        self.at_first_step: dict | None = None
        self.at_first_timed_step: dict | None = None
        self.dir: str | None = None  # the first step's gradients wait here
        self.check_s = 0.0

    @property
    def grads_path(self) -> str:
        return os.path.join(self.dir or "", "first-step.pt")

    def keep_batch(self, x, y) -> None:
        """The first step's batch, as the data gave it (before any device or layout)."""
        self.batch = (x, y)

    def inspect(self, net, step: int, first_timed: int) -> None:
        """Called inside step ``step`` (from 0), its gradients in place: the first step's
        are kept, the first timed step's (``first_timed``: the warm-up's length) are
        counted."""
        if step == 0:
            self.after_first_step(net)
        if step == first_timed:
            self.after_first_timed_step(net, step)

    def after_first_step(self, net) -> None:
        """The first step's gradients: kept on disk."""
        import torch

        t0 = time.perf_counter()
        grads = public_gradients(net)
        self.at_first_step = summary(grads)
        if self.reference:
            self.dir = make_folder()
            # removed with the check, or at exit when the run fails before its verdict;
            # a killed run's (SIGKILL runs neither) by the next sweep (shm.sweep_scratch)
            weakref.finalize(self, shutil.rmtree, self.dir, True)
            torch.save(grads, self.grads_path)
        del grads
        self.check_s += time.perf_counter() - t0

    def after_first_timed_step(self, net, step: int) -> None:
        t0 = time.perf_counter()
        self.at_first_timed_step = {"step": step + 1, **received(net)}
        self.check_s += time.perf_counter() - t0

    def verdict(self, forward_loss, world: int) -> dict:
        """The check's record: ``ok``, and ``problem`` (a sentence) when the step did not
        train the whole model or not as eager does. ``forward_loss(model, x, y)``: the
        run's forward pass with its loss; ``world``: its ranks."""
        t0 = time.perf_counter()
        try:
            compared = self._compare(forward_loss, world) if self.reference else None
        finally:
            if self.dir:
                shutil.rmtree(self.dir, ignore_errors=True)
        got = self._received()
        out = {
            "received": got,
            "received_at_first_step": self.at_first_step,
            "reference": self._reference_text(),
            "precision": self.spec["precision"],
            "comparison": compared,
            "problem": problem(
                got, compared, self.spec["precision"], self.carried.get("negligible", ())
            ),
        }
        out["ok"] = out["problem"] is None
        self.check_s += time.perf_counter() - t0
        out["check_s"] = self.check_s
        return out

    def _reference_text(self) -> str:
        if self.reference:
            return "fp64 eager and eager at the run's precision"
        if needs_reference(self.spec):
            return f"fp64 eager and eager at the run's precision, {self.carried['from']}'s"
        return "none: plain fp32 eager is the reference"

    def _received(self) -> dict:
        """What the first step and the first timed step received, lost names merged."""
        seen = [x for x in (self.at_first_step, self.at_first_timed_step) if x]
        if not seen:
            return {}
        out = dict(seen[-1])
        for key in LOST_KINDS:
            out[key] = list(dict.fromkeys(n for x in seen for n in x.get(key, [])))
        lost = {n for key in LOST_KINDS for n in out[key]}
        out["with_gradient"] = out["parameters"] - len(lost)
        return out

    def _compare(self, forward_loss, world: int) -> dict:
        import torch

        if self.batch is None or not self.dir or not os.path.exists(self.grads_path):
            return {"error": "the first step's batch or gradients were not kept"}
        spec = self.spec
        truth = self._reference(forward_loss, torch.float64, world)
        if truth is None:
            return {"error": "the reference model could not be rebuilt with the run's weights"}
        run = torch.load(self.grads_path)
        own = None  # plain eager at its precision is its own reference
        bf16_weights = own_weights_dtype(spec) == "bf16"
        if not plain_eager(spec):
            dtype = torch.bfloat16 if spec["precision"] == "bf16" else torch.float32
            own = self._reference(forward_loss, dtype, world, bf16_weights=bf16_weights)
        compared = compare(run, self.first_loss, truth, own, spec["precision"])
        if own and bf16_weights:
            compared["own_precision_reference"] = "eager with bf16 weights"
        if self.shared:
            compared["shared_references"] = dict(self.shared)
        return compared

    def _reference(self, forward_loss, dtype, world: int, bf16_weights: bool = False):
        """:meth:`_eager`'s step, taken from the store where another experiment made the
        same one (references.py), else made here and left there; its gradients then
        averaged over the ranks, as DDP averages the run's (each rank keeps its own)."""
        import torch

        from . import references

        if self.store is None:
            return _averaged(self._eager(forward_loss, dtype, bf16_weights=bf16_weights), world)
        rank = torch.distributed.get_rank() if world > 1 else 0
        name = {torch.float64: "fp64", torch.float32: "fp32", torch.bfloat16: "bf16"}[dtype]
        which = references.kind(name, bf16_weights)
        key = references.runtime_key(which, self.rng_state, self.initial, self.batch)
        kept = self.store.load(which, key, rank)
        if kept is not None:
            loss, grads, made_by = kept
            # (one this experiment made is its own: an earlier attempt's of this trial,
            # rerun for noise; not shared)
            if made_by != self.store.spec.get("id"):
                self.shared[which] = made_by
            return _averaged((loss, grads), world)
        made = self._eager(forward_loss, dtype, bf16_weights=bf16_weights)
        if made is not None:
            self.store.save(which, key, *made, rank=rank)
        return _averaged(made, world)

    def _eager(self, forward_loss, dtype, bf16_weights: bool = False) -> tuple[float, dict] | None:
        """One eager step from the run's initial weights on its first batch (the rank's):
        fp64 (the model and inputs in float64), fp32, or bf16 (CPU autocast;
        ``bf16_weights``: the model cast to bf16 as well, as a backend that holds its
        weights in bf16 runs); its loss and its gradients."""
        import contextlib

        import torch

        from . import models

        spec = self.spec
        with torch.random.fork_rng(devices=[]):
            torch.set_rng_state(self.rng_state)
            attention = spec.get("attention") or "sdpa"
            model = models.build(spec["model"], attention, False, self.weights)
        if checksum(model) != self.initial:
            return None
        x, y = self.batch
        if spec.get("channels_last"):
            model = model.to(memory_format=torch.channels_last)
            x = x.contiguous(memory_format=torch.channels_last)
        if dtype == torch.float64:
            model = model.double()
            if not isinstance(x, dict):
                x = x.double()
        elif bf16_weights:
            model = model.to(torch.bfloat16)
        model.train()
        bf16 = dtype == torch.bfloat16
        autocast = torch.autocast("cpu", dtype=dtype) if bf16 else contextlib.nullcontext()
        with autocast:
            _, loss = forward_loss(model, x, y)
        loss.backward()
        grads = {n: p.grad for n, p in model.named_parameters() if p.requires_grad}
        return float(loss.detach()), grads


def _averaged(made: tuple[float, dict] | None, world: int) -> tuple[float, dict] | None:
    """A reference step's gradients averaged over the ranks (in place), with several."""
    if made is not None and world > 1:
        _average_over_ranks(made[1])
    return made


def _average_over_ranks(grads: dict) -> None:
    """Gradients averaged over the ranks, as DDP averages the run's; over a Gloo group of
    their own, so that the check does not use the collective it checks."""
    import torch
    import torch.distributed as dist

    group = None if dist.get_backend() == "gloo" else dist.new_group(backend="gloo")
    names = [n for n, g in grads.items() if g is not None]
    flat = torch.cat([grads[n].reshape(-1) for n in names])
    dist.all_reduce(flat, group=group)
    flat /= dist.get_world_size()
    offset = 0
    for n in names:
        k = grads[n].numel()
        grads[n] = flat[offset : offset + k].view_as(grads[n])
        offset += k


def multiplier(values: int) -> float:
    """How many times eager's own error a parameter of this many values may be off."""
    for most, factor in SMALL_TENSOR_MULTIPLIERS:
        if values <= most:
            return factor
    return MULTIPLIER


def relative_errors(grads: dict, truth: dict) -> tuple[dict, dict]:
    """Per parameter of ``truth``, the relative error ||g - g64|| / ||g64|| of ``grads``'s
    gradient (matched by name; a packed one by its number of values); and the names
    that could not be compared: ``negligible`` (a reference gradient of noise),
    ``missing`` (no gradient), ``unmatched`` (no such parameter)."""
    largest = max((float(g.norm()) for g in truth.values() if g is not None), default=0.0)
    errors: dict[str, float] = {}
    left: dict[str, list[str]] = {"negligible": [], "missing": [], "unmatched": []}
    for name, r in truth.items():
        if r is None:
            continue
        g = grads.get(name)
        if name not in grads or (g is not None and g.numel() != r.numel()):
            left["unmatched"].append(name)
        elif g is None:
            left["missing"].append(name)
        elif float(r.norm()) <= NEGLIGIBLE * largest:
            left["negligible"].append(name)
        else:
            diff = g.double().reshape(r.shape) - r.double()
            errors[name] = float(diff.norm() / r.double().norm())
    return errors, left


def compare(
    run: dict, run_loss: float | None, truth: tuple, own: tuple | None, precision: str
) -> dict:
    """The run's first-step gradients and loss against fp64 eager's (``truth``: loss,
    gradients), each parameter within :data:`MULTIPLIER` times the error of eager at the
    run's precision (``own``; None: the run is that eager itself) plus :data:`FLOOR`."""
    truth_loss, truth_grads = truth
    errors, left = relative_errors(run, truth_grads)
    own_errors = relative_errors(own[1], truth_grads)[0] if own else dict(errors)
    typical = _median(list(own_errors.values())) or 0.0
    limits = {
        n: multiplier(truth_grads[n].numel()) * max(own_errors.get(n, typical), typical)
        + FLOOR[precision]
        for n in errors
    }
    order = sorted(errors.items(), key=lambda kv: (math.isfinite(kv[1]), -_finite(kv[1])))
    over = [(n, e) for n, e in order if not e <= limits[n]]

    def entry(name: str, error: float) -> dict:
        return {
            "parameter": name,
            "rel_error": error,
            "eager_rel_error": own_errors.get(name),
            "limit": limits[name],
        }

    loss_error = None
    if run_loss is not None:
        loss_error = abs(run_loss - truth_loss) / max(abs(truth_loss), 1e-12)
    return {
        "own_precision_reference": "eager" if own else "the run itself (plain eager)",
        "multiplier": MULTIPLIER,
        "small_tensor_multipliers": [list(x) for x in SMALL_TENSOR_MULTIPLIERS],
        "floor": FLOOR[precision],
        "compared": len(errors),
        **left,
        "max_rel_error": max(errors.values()) if errors else None,
        "median_rel_error": _median(list(errors.values())),
        "eager_median_rel_error": typical,
        "worst": [entry(n, e) for n, e in order[:NAMES_SHOWN]],
        "over_limit": [entry(n, e) for n, e in over],
        "loss": run_loss,
        "reference_loss": truth_loss,
        "loss_rel_error": loss_error,
        "loss_tolerance": LOSS_TOLERANCE[precision],
    }


def _finite(x: float) -> float:
    return x if math.isfinite(x) else 0.0


def _median(values: list[float]) -> float | None:
    values = sorted(v for v in values if math.isfinite(v))
    if not values:
        return None
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2


def _names(names: list[str]) -> str:
    shown = ", ".join(names[:NAMES_SHOWN])
    more = len(names) - NAMES_SHOWN
    return shown + (f" and {more} more" if more > 0 else "")


def problem(got: dict, compared: dict | None, precision: str, carried_negligible=()) -> str | None:
    """Why the step does not count (None: it trained the whole model, as eager does).
    ``carried_negligible``: without a comparison of its own, the negligible parameters
    of the first trial's (trial/carry.py)."""
    usable = compared is not None and not compared.get("error")
    nonfinite = got.get("nonfinite_gradient", [])
    # a gradient that is noise in fp64 may come out as an exact zero elsewhere
    negligible = set(compared["negligible"]) if usable else set(carried_negligible)
    lost = [
        n for key in LOST_KINDS for n in got.get(key, []) if n not in negligible or n in nonfinite
    ]
    n = got.get("parameters", 0)
    if lost:
        kinds = []
        for key, word in LOST_KINDS.items():
            k = len([x for x in got.get(key, []) if x in lost])
            if k:
                kinds.append(f"{k} got {word}")
        return (
            f"the step trained {n - len(lost)} of {n} parameter tensors ({', '.join(kinds)}: "
            f"{_names(lost)})"
        )
    if not usable:
        return None
    if compared["missing"]:
        return (
            f"{len(compared['missing'])} of {n} parameter tensors got no gradient where eager "
            f"gets one: {_names(compared['missing'])}"
        )
    over = compared["over_limit"]
    if over:
        shown = ", ".join(
            f"{o['parameter']} ({o['rel_error']:.3g} > {o['limit']:.3g})"
            for o in over[:NAMES_SHOWN]
        )
        return (
            f"the first step's gradients are further from fp64 eager's than {MULTIPLIER:g}x "
            f"eager {precision}'s own error allows (8x for a tensor of 500 values or fewer) "
            f"in {len(over)} of {compared['compared']} parameter tensors (relative error > "
            f"limit): {shown}"
        )
    loss_error = compared.get("loss_rel_error")
    if loss_error is not None and not loss_error <= compared["loss_tolerance"]:
        return (
            f"the first step's loss {compared['loss']:.6g} differs from fp64 eager's "
            f"{compared['reference_loss']:.6g} by {loss_error:.3g} (relative; the {precision} "
            f"tolerance is {compared['loss_tolerance']:g})"
        )
    return None


def make_folder() -> str:
    """A new folder for this process's first-step gradients, in the temporary folder,
    named by its host and pid (``shm.scratch_prefix``); what killed checks of this host
    left there is removed first (``shm.sweep_scratch``)."""
    from ..shm import scratch_prefix, sweep_scratch

    sweep_scratch()
    return tempfile.mkdtemp(prefix=scratch_prefix(os.getpid()))
