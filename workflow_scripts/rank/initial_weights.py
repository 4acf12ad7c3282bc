"""A model's initial weights, drawn once per study and read back by later builds.

Building a model draws its random initial weights from torch's CPU generator, one
value at a time on one core whatever the machine: GPT-2 small's 124 M values took
3.3 s on a 2-vCPU EPYC, BERT-base's 110 M 1.2 s, ResNet-50's 26 M 0.3 s. Every trial
builds its model (each rank of a data-parallel one), and a first trial's gradient
check builds it again for its references, so a study draws the same weights from the
same generator state hundreds of times.

So a build (:func:`build`) keeps what it drew in ``<results>/initial-weights/``: the
parameters' and buffers' bytes and the generator's state after the draw. A later build
of the same model, from the same generator state, with the same torch and model
library, makes the model on the meta device (no draw), gives it empty storage, reads
the bytes into it, ties the weights the model ties, and leaves the generator where the
draw would have left it: the same model, value for value, and the same random numbers
after it (``tests/test_harness.py``), in 0.3-0.6 s instead of 1.2-3.3 s. What the key
does not match, or a file that does not read back whole, is drawn again (and kept).

The folder keeps at most :data:`MAX_BYTES` (GPT-2 small's weights are 0.5 GB): those
used least recently go first. Deleting it only draws them again.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

from .. import workloads
from ..util import beside_records
from . import references

if TYPE_CHECKING:  # (torch is the run's: the trial policy, which mounts the folder, has none)
    import torch
    from torch import nn

#: the folder beside ``records/`` where builds keep the weights they drew
FOLDER = "initial-weights"
#: the most the folder keeps, in bytes (the least recently used go first)
MAX_BYTES = 3 * 2**30


def folder(out: Path | str | None) -> Path | None:
    """The initial weights' folder of the study whose (rank) result is ``out``."""
    return beside_records(out, FOLDER) if out else None


def key(name: str, attention: str, rng_state: torch.Tensor, made=None) -> str:
    """What a model's initial weights depend on: the model's declaration, its attention
    implementation, the code that builds it (the file of ``made``'s function:
    ``rank/models.py``, where a model added to the study is built), the versions of
    torch and of its library, and the generator's state before the draw (not dropout:
    it has no weights and draws nothing)."""
    import torch

    w = workloads.get(name)
    versions = {"torch": torch.__version__, "torch_git": torch.version.git_version}
    code = getattr(getattr(made, "func", made), "__code__", None)
    if code is not None:
        with contextlib.suppress(OSError):
            versions["code"] = hashlib.sha256(Path(code.co_filename).read_bytes()).hexdigest()
    for module in workloads.libraries(name):
        top = module.split(":")[0].split(".")[0]
        versions[top] = getattr(__import__(top), "__version__", "?")
    declared = {
        "name": name, "attention": attention, "hf_class": w.hf_class,
        "hf_config": dict(w.hf_config or {}), "num_classes": w.num_classes,
        "versions": versions,
    }  # fmt: skip
    h = hashlib.sha256(json.dumps(declared, sort_keys=True, default=str).encode())
    h.update(rng_state.numpy().tobytes())
    return h.hexdigest()[:24]


def _tensors(model: nn.Module) -> list[tuple[str, torch.Tensor]]:
    """The model's parameters (each once) and buffers, in the model's order."""
    return [*model.named_parameters(), *model.named_buffers()]


def _layout(model: nn.Module) -> list[list]:
    return [[n, list(t.shape), str(t.dtype)] for n, t in _tensors(model)]


def _bytes(t: torch.Tensor) -> memoryview:
    import torch

    return memoryview(t.detach().reshape(-1).view(torch.uint8).numpy())


def _ties(model: nn.Module) -> list[list[str]]:
    """The names under which one parameter is registered more than once (GPT-2's
    output layer is its token embedding)."""
    seen: dict[int, list[str]] = {}
    for n, p in model.named_parameters(remove_duplicate=False):
        seen.setdefault(id(p), []).append(n)
    return [names for names in seen.values() if len(names) > 1]


def _read(made, meta: dict, path: Path) -> nn.Module | None:
    """The model ``made()`` builds, its weights read from ``path`` (``meta``: what was
    kept); None where it does not match or does not read back whole."""
    import torch

    with torch.device("meta"):
        model = made()
    if _layout(model) != meta["layout"]:
        return None
    ties = _ties(model)
    model = model.to_empty(device="cpu")
    for names in ties:  # (to_empty gives each registration its own storage)
        first = model.get_parameter(names[0])
        for other in names[1:]:
            owner, _, attr = other.rpartition(".")
            setattr(model.get_submodule(owner), attr, first)
    with open(path, "rb", buffering=0) as f:
        for _, t in _tensors(model):
            if not t.is_contiguous():
                return None
            view = _bytes(t)
            if f.readinto(view) != view.nbytes:
                return None
        if f.read(1):
            return None
    return model


def _write(model: nn.Module, rng_after: torch.Tensor, where: Path, name: str) -> None:
    """Keep ``model``'s weights (and the generator's state after the draw) as ``name``:
    the bytes first, then the description that makes them found."""
    where.mkdir(parents=True, exist_ok=True)
    data, meta = where / f"{name}.bin", where / f"{name}.json"
    partial = [path.with_name(f".{path.name}.{os.getpid()}.tmp") for path in (data, meta)]
    try:
        with open(partial[0], "wb") as f:
            for _, t in _tensors(model):
                f.write(_bytes(t.contiguous()))
        os.replace(partial[0], data)
        described = {"layout": _layout(model), "rng_after": rng_after.numpy().tobytes().hex()}
        partial[1].write_text(json.dumps(described))
        os.replace(partial[1], meta)
    finally:
        for path in partial:
            path.unlink(missing_ok=True)
    references.evict(where, MAX_BYTES, keep=data, pattern="*.bin")


def build(made, name: str, attention: str, where: Path | None) -> tuple[nn.Module, bool]:
    """``made()``'s model (a build of model ``name`` that draws its weights from torch's
    CPU generator), from ``where`` where this draw was kept, else drawn and kept there
    (``where`` None: drawn, kept nowhere); and whether it was read."""
    import torch

    if where is None:
        return made(), False
    state = torch.get_rng_state()
    name_ = key(name, attention, state, made)
    data, meta_path = where / f"{name_}.bin", where / f"{name_}.json"
    try:
        meta = json.loads(meta_path.read_text())
        model = _read(made, meta, data)
        after = torch.frombuffer(bytearray.fromhex(meta["rng_after"]), dtype=torch.uint8)
    except Exception:  # noqa: BLE001 - unreadable, or a model that cannot be made on
        model = None  # the meta device (a user's): drawn, as without the folder
    if model is not None:
        torch.set_rng_state(after.clone())
        with contextlib.suppress(OSError):
            os.utime(data)
        return model, True
    torch.set_rng_state(state)  # (a model that did not match may have drawn nothing)
    model = made()
    with contextlib.suppress(OSError):
        _write(model, torch.get_rng_state(), where, name_)
    return model, False
