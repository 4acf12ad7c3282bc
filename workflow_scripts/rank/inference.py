"""Inference as it is served: the model that answers (logits from inputs, no labels), a
model trained by the trial itself before it is served (``data: digits`` or
``keywords`` with ``epochs``), the calibration of an INT8 model, and what the served
model computed: its agreement with the fp32 eager model it came from, its held-out
accuracy, and the oneDNN kernels it ran (their data types and ISA: INT8 with VNNI or
AMX, or a silent fp32 fallback).

Runs inside a backend environment (torch imported at call time)."""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import os
import re
import sys
import tempfile
import time
from pathlib import Path

from .. import workloads

#: the INT8 calibration: the first this many batches of the run's own data (the
#: training split for digits and keywords, the synthetic source's batches otherwise),
#: drawn from a stream apart from the timed steps'
CALIBRATION_BATCHES = 4


def _beside(out: Path | str, suffix: str) -> Path:
    """A file of the trial whose record is ``out`` (or its rank's result next to it),
    named by the trial: ``trial<k><suffix>``."""
    out = Path(out)
    return out.with_name(out.name.split(".")[0] + suffix)


def calibration_path(out: Path | str) -> Path:
    """Where a trial keeps the INT8 calibration it made (the backend's own file: IPEX's
    qconf summary, JSON)."""
    return _beside(out, ".int8-calibration.json")


@dataclasses.dataclass
class Int8Scales:
    """Where an INT8 model's calibration comes from and goes, and what happened:
    ``carried``, its first trial's file (trial/carry.py), read instead of running the
    calibration batches; ``keep``, where a calibration made here is written for the
    later trials (where the backend can write one). The same batches (the run's data,
    from the same seed) through the same observers give the same scales, so a later
    trial quantizes to the same model without its calibration's forward passes (IPEX's
    observers: 4.6 s a batch of 16 for ResNet-50 on 2 vCPUs, 5x its fp32 eager forward)."""

    carried: str | None = None
    keep: Path | None = None
    how: str = "calibrated"

    def done(self) -> dict:
        """What the record says (``checks.serving.int8_calibration``): how, and the
        file's path and SHA-256 where there is one."""
        path = Path(self.carried) if self.carried else self.keep
        out: dict = {"how": self.how}
        if path is not None and path.is_file():
            out.update({"path": str(path), "sha256": file_sha256(path)})
        return out


def file_sha256(path: Path | str) -> str:
    import hashlib

    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def served(w: workloads.Workload, model):
    """``model`` as a server calls it: inputs in, logits out (a text model's token ids
    and attention mask as positional arguments, what torch.jit.trace and torch.export
    take)."""
    import torch

    class VisionLogits(torch.nn.Module):
        def __init__(self, net):
            super().__init__()
            self.net = net

        def forward(self, x):
            return self.net(x)

    class TextLogits(torch.nn.Module):
        def __init__(self, net):
            super().__init__()
            self.net = net

        def forward(self, input_ids, attention_mask):
            return self.net(input_ids=input_ids, attention_mask=attention_mask).logits

    return (TextLogits if w.text else VisionLogits)(model).eval()


def weights_path(out: Path | str, experiment: str | None = None) -> Path:
    """Where a trial whose record is ``out`` (or its rank's result next to it) keeps the
    weights it trained; with ``experiment``: where that experiment's first trial, in the
    same results, keeps them."""
    if experiment:
        return Path(out).parent.parent / experiment / "trial0.weights.pt"
    return _beside(out, ".weights.pt")


#: the modules that hold a model's weight multiply-adds (transformers' ``Conv1D`` is
#: GPT-2's linear layer, an addmm)
WEIGHT_LAYERS = ("Linear", "Conv1d", "Conv2d", "Conv3d", "ConvTranspose2d", "Conv1D")


def weight_layers(model) -> int:
    """How many weight layers (linear, convolution) one forward pass of ``model`` runs:
    what an INT8 model would run as INT8 kernels, all of them quantized."""
    return sum(type(m).__name__ in WEIGHT_LAYERS for m in model.modules())


def inputs(x) -> tuple:
    """A batch's inputs as the served model takes them (positional)."""
    return (x["input_ids"], x["attention_mask"]) if isinstance(x, dict) else (x,)


def loss_of(w: workloads.Workload, logits, y):
    """The loss the model's own head computes from its logits (Hugging Face's: a causal
    LM's shifted next-token loss, a classifier's cross entropy; a vision model's cross
    entropy): only a sign of what the served model computed."""
    import torch

    f = torch.nn.functional
    if w.task == "causal-lm":
        return f.cross_entropy(
            logits[:, :-1].reshape(-1, logits.shape[-1]).float(),
            y[:, 1:].reshape(-1),
            ignore_index=-100,
        )
    return f.cross_entropy(logits.float(), y)


def pretrain(spec: dict, model, batches, w: workloads.Workload) -> dict:
    """Train ``model`` (fp32 eager, the spec's optimizer and schedule) for the spec's
    ``epochs`` over ``batches`` (the training split; ``max_steps`` cuts it short), before
    it is served."""
    import torch

    from . import models, optim

    steps = spec["epochs"] * batches.steps_per_epoch
    if spec.get("max_steps"):  # a pre-flight cuts the training short
        steps = min(steps, spec["max_steps"])
    optimizer = optim.build(model.parameters(), spec)
    schedule = optim.scheduler(optimizer, spec, steps)
    model.train()
    t0 = time.perf_counter()
    loss = None
    for _ in range(steps):
        x, y = next(batches)
        optimizer.zero_grad(set_to_none=True)
        _, loss = models.forward_loss(w, model, x, y, torch.nn.functional.cross_entropy)
        loss.backward()
        optimizer.step()
        if schedule is not None:
            schedule.step()
    model.eval()
    return {
        "epochs": spec["epochs"],
        "steps": steps,
        "train_s": time.perf_counter() - t0,
        "final_loss": float(loss.detach()) if loss is not None else None,
    }


def save_weights(model, out: str) -> dict:
    """Keep the weights a run trained beside its result (``weights_path``), written
    whole or not at all; their path and SHA-256."""
    import torch

    path = weights_path(out)
    tmp = path.with_name(path.name + ".tmp")
    torch.save(model.state_dict(), tmp)
    os.replace(tmp, path)
    return {"weights": "saved", **_weights_file(path)}


def _weights_file(path: Path) -> dict:
    return {"weights_path": str(path), "weights_sha256": file_sha256(path)}


def load_weights(model, spec: dict, out: str | None) -> dict:
    """Load the weights the first trial of ``spec['weights_from']`` trained (same model,
    same training: the study checks it) instead of training them again."""

    source = spec["weights_from"]
    if not out:
        raise ValueError(f"weights_from {source!r}: the run has no result path to find them by")
    path = weights_path(out, source)
    if not path.exists():
        raise FileNotFoundError(
            f"weights_from {source!r}: {path} is missing (its first trial did not train "
            "them: see its record)"
        )
    return _loaded(model, spec, path, f"loaded from {source} (trial 0)")


def load_carried_weights(model, spec: dict, path: str) -> dict:
    """Load the weights this experiment's first trial trained (``path``: trial/carry.py
    checked it against that trial's record) instead of training them again."""
    return _loaded(model, spec, Path(path), "loaded from trial 0 (carried)")


def _loaded(model, spec: dict, path: Path, how: str) -> dict:
    """``path``'s weights loaded into ``model``; what the record says of them."""
    import torch

    model.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))
    return {"epochs": spec["epochs"], "weights": how, **_weights_file(path)}


def score(logits_of, held_out, batch_size: int, channels_last: bool) -> float:
    """Held-out accuracy of a served model (``logits_of(*inputs)``), called at the run's
    own batch shape (a traced or exported graph may hold it fixed): the split in
    batches of ``batch_size``, the last one filled up with repeats of its first sample,
    which are not scored."""
    import torch

    dataset, collate = held_out.dataset, held_out.collate_fn
    n, correct = len(dataset), 0
    with torch.inference_mode():
        for start in range(0, n, batch_size):
            index = list(range(start, min(start + batch_size, n)))
            real = len(index)
            index += [index[0]] * (batch_size - real)
            x, y = collate([dataset[i] for i in index])
            if channels_last:
                x = x.contiguous(memory_format=torch.channels_last)
            out = logits_of(*inputs(x))[:real].float()
            correct += int((out.argmax(dim=-1) == y[:real]).sum())
    return correct / n


def agreement(reference, logits) -> dict:
    """How close the served model's logits are to the fp32 eager model's on one batch:
    cosine similarity of the flattened logits, the largest absolute difference (and
    the reference's largest magnitude, its scale), and the share of positions whose
    arg-max agrees."""
    import torch

    # in float64: a causal LM's logits are millions of values, whose float32 sums put
    # the cosine above 1
    ref, out = reference.double().flatten(1), logits.double().flatten(1)
    cos = torch.nn.functional.cosine_similarity(ref.flatten(), out.flatten(), dim=0)
    top_ref, top_out = reference.float().argmax(-1), logits.float().argmax(-1)
    return {
        "cosine": float(cos),
        "max_abs_diff": float((ref - out).abs().max()),
        "reference_max_abs": float(ref.abs().max()),
        "top1_agreement": float((top_ref == top_out).float().mean()),
    }


# ------------------------------------------------------------------ oneDNN kernels
#: the primitives that hold a model's multiply-adds
HEAVY = ("convolution", "matmul", "inner_product", "deconvolution")
_DTYPE = re.compile(r"\b(src|wei)[_:]([a-z0-9]+)")


@contextlib.contextmanager
def _stdout_to(path: str):
    """The process's file descriptor 1 (where oneDNN writes its verbose lines) sent to
    ``path`` for the block."""
    sys.stdout.flush()
    saved = os.dup(1)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.dup2(fd, 1)
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)
        os.close(fd)


def onednn_trace(run, verbose_contexts) -> list[str]:
    """oneDNN's verbose lines of one call of ``run`` (``verbose_contexts``: the
    backend's switches for every oneDNN library in the process)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "onednn.log")
        with _stdout_to(path), contextlib.ExitStack() as stack:
            for ctx in verbose_contexts:
                stack.enter_context(ctx)
            run()
        with open(path, errors="replace") as f:
            return [line.rstrip("\n") for line in f if line.startswith("onednn_verbose")]


def kernels(lines: list[str]) -> dict:
    """What oneDNN ran, from its verbose lines: the ISA it dispatched for, and its
    multiply-add primitives by (kind, implementation, source and weight data types),
    with how many of them ran in INT8 (8-bit weights) and in bf16. (A kernel outside
    oneDNN, MKL's or inductor's own GEMM, is not seen here: the share of a model's weight
    layers that ran in INT8 is ``int8_primitives`` over ``weight_layers``.)"""
    isa = None
    counts: collections.Counter = collections.Counter()
    for line in lines:
        parts = line.split(",")
        if "isa:" in line and ",info," in line:
            isa = line.split("isa:", 1)[1].strip()
            continue
        # onednn_verbose[,v1][,<timestamp>][,primitive],exec,cpu,<kind>,<impl>,<prop>,<mds>
        if "exec" not in parts or "graph" in parts[: parts.index("exec")]:
            continue
        e = parts.index("exec")
        if len(parts) < e + 6:
            continue
        kind, impl, descs = parts[e + 2], parts[e + 3], parts[e + 5]
        if kind not in HEAVY:
            continue
        types = dict(_DTYPE.findall(descs))
        counts[(kind, impl, types.get("src", "?"), types.get("wei", "?"))] += 1
    heavy = sum(counts.values())
    int8 = sum(n for (_, _, _, wei), n in counts.items() if wei in ("s8", "u8"))
    bf16 = sum(n for (_, _, src, _), n in counts.items() if src == "bf16")
    impls = sorted({impl for (_, impl, _, _) in counts})
    return {
        "isa": isa,
        "heavy_primitives": heavy,
        "int8_primitives": int8,
        "bf16_primitives": bf16,
        "implementations": impls,
        "primitives": [
            {"kind": k, "implementation": i, "src": s, "wei": wt, "count": n}
            for (k, i, s, wt), n in sorted(counts.items())
        ],
        "int8_isa": int8_isa(impls) if int8 else None,
    }


def int8_isa(implementations: list[str]) -> str:
    """The CPU feature an INT8 kernel's implementation name says it ran on: AMX (its
    tiles), VNNI (AVX-512's or AVX's), or neither (8-bit data on plain SIMD)."""
    names = " ".join(implementations)
    if "amx" in names:
        return "AMX-INT8"
    if "vnni" in names:
        return "AVX-VNNI" if "avx2_vnni" in names else "AVX512-VNNI"
    return "no VNNI/AMX"
