"""The gradient check's eager references, made once for the experiments that share them.

A first trial's gradient check (``gradcheck.py``) rebuilds the model from the run's
initial weights and takes one eager step on the run's first batch in fp64 (the truth)
and, where the run is not plain eager, one at the run's own precision. Those steps
depend on the model, its initial weights, the batch, the memory format, the dtype and
the thread count, not on the rung: the bf16, compiled and IPEX rungs of one model at
one batch ask for the same fp64 step (a BERT-base one took 20-30 s on 2 cores). So a
trial leaves each reference it made in ``<results>/gradcheck-references/`` and a later
first trial of another experiment takes it from there when it asks for the same one.

**The same step, checked.** A reference is found by its plan key (:func:`plan_key`:
the spec's fields that shape the step, and the reference's kind) and used only where
its runtime key is equal too: the hashes of the random-number state the model was
built from, of the run's initial weights (each parameter's sum) and of the batch's
bytes, the thread count, the versions of torch and of the libraries loaded (IPEX,
torch_xla, transformers) and the CPU's model and flags. Equal keys mean the same
computation, so the comparison comes out the same to the last digit; anything else
makes the reference again. The record's comparison says which it shared
(``shared_references``: the kind and the experiment that made it).

**Across environments, launchers and ranks.** The plan key names the torch release an
environment pins (``envs/<env>.txt``), not the environment: two environments of one torch
build (upstream and oneccl) and a run under any launcher (none, torchrun, Accelerate,
run_cpu) ask for the same step, and the runtime key (torch's release and commit, the
libraries loaded) still tells builds apart. A data-parallel run's rank keeps its own
step, on its own share of the batch, under its rank's name (``rank`` in the plan key),
before the ranks average them as DDP averages the run's: another data-parallel run of
the same model, ranks and batch (another process group, launcher or environment) reads
each rank's and averages those.

The folder keeps at most :data:`MAX_BYTES` (a BERT-base fp64 reference is 0.9 GB): the
references used least recently go first. Deleting it only makes them again.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import time
from pathlib import Path

from ..util import beside_records, lock_pins, read_json, write_json_atomic

#: the folder beside ``records/`` where first trials leave their references
FOLDER = "gradcheck-references"
#: the most the folder keeps, in bytes (the least recently used go first)
MAX_BYTES = 4 * 2**30
#: the spec's fields that shape a reference step (with the reference's kind and the
#: torch release its environment pins: :func:`torch_pin`)
PLAN_FIELDS = (
    "model", "attention", "batch_size", "image_size", "seq_len", "data", "data_dir",
    "padding", "seed", "channels_last", "threads", "cpus", "ranks", "nodes", "comm_cpu",
)  # fmt: skip
#: where the environments' pinned requirements are
ENVS = Path(__file__).resolve().parents[2] / "envs"


def kind(dtype_name: str, bf16_weights: bool = False) -> str:
    """A reference's kind: ``fp64``, ``fp32``, ``bf16`` (autocast) or ``bf16-weights``."""
    return f"{dtype_name}-weights" if bf16_weights else dtype_name


def shares(spec: dict) -> bool:
    """Whether the spec's references can be shared (a trained run; a data-parallel
    run's rank by rank)."""
    return spec.get("mode", "train") == "train"


def world(spec: dict) -> int:
    """The spec's ranks in all."""
    return int(spec.get("ranks") or 1) * int(spec.get("nodes") or 1)


@functools.cache
def torch_pin(env: str) -> str:
    """The torch release ``envs/<env>.txt`` pins (``torch==2.14.1``, its hashed lock read
    as the image builds read it: ``util.lock_pins``); the environment's name where it
    pins none there (an environment of its own)."""
    try:
        pins = lock_pins(ENVS / f"{env}.txt") or []
    except OSError:
        pins = []
    found = [version for name, version, _ in pins if name == "torch"]
    return f"torch=={found[0]}" if found else f"env:{env}"


def plan_key(spec: dict, which: str, rank: int = 0) -> dict:
    """What finds a reference: the spec's fields that shape its step, its kind, the
    torch its environment pins, and (a data-parallel run's) the rank."""
    key = {"kind": which, "torch": torch_pin(str(spec.get("env") or "upstream"))}
    key.update({k: spec.get(k) for k in PLAN_FIELDS})
    if world(spec) > 1:
        key["rank"] = int(rank)
    return key


def folder(out: Path | str) -> Path:
    """The references' folder of the study whose record is ``out``."""
    return beside_records(out, FOLDER)


def key_name(spec: dict, which: str, rank: int = 0) -> str:
    """The name a reference of this kind for this spec's step (its rank's) is kept under."""
    key = json.dumps(plan_key(spec, which, rank), sort_keys=True, default=str)
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def known(out: Path | str, spec: dict, which: str) -> bool:
    """Whether a reference of this kind for this spec's step is there, every rank's
    (its runtime key is checked only where it is used)."""
    where = folder(out)
    return shares(spec) and all(
        (where / f"{key_name(spec, which, rank)}.json").is_file() for rank in range(world(spec))
    )


class Store:
    """The references' folder, as one trial's gradient check reads and writes it."""

    def __init__(self, where: Path | str, spec: dict):
        self.folder = Path(where)
        self.spec = spec

    @classmethod
    def for_record(cls, out: Path | str | None, spec: dict) -> Store | None:
        """The store of the study whose (rank) result is ``out``; None without one, or
        for a run that does not share."""
        return cls(folder(out), spec) if out and shares(spec) else None

    def _paths(self, which: str, rank: int) -> tuple[Path, Path]:
        name = key_name(self.spec, which, rank)
        return self.folder / f"{name}.json", self.folder / f"{name}.pt"

    def load(self, which: str, runtime: dict, rank: int = 0):
        """(loss, gradients, the experiment that made it) of the reference of this kind
        (rank ``rank``'s) whose runtime key is ``runtime``; None where there is none (or
        it is unusable)."""
        import torch

        meta_path, path = self._paths(which, rank)
        try:
            meta = read_json(meta_path, want=None)
            if not isinstance(meta, dict) or meta.get("runtime") != runtime:
                return None
            kept = torch.load(path, weights_only=True)
            os.utime(path)  # (recently used: kept longest)
        except (OSError, ValueError, RuntimeError, EOFError):
            return None
        if not isinstance(kept, dict) or not isinstance(kept.get("grads"), dict):
            return None
        return float(kept["loss"]), kept["grads"], str(meta.get("experiment"))

    def save(self, which: str, runtime: dict, loss: float, grads: dict, rank: int = 0) -> None:
        """Leave a reference made here (rank ``rank``'s) for the other experiments
        (nothing where the folder cannot be written)."""
        import torch

        meta_path, path = self._paths(which, rank)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            torch.save({"loss": loss, "grads": grads}, tmp)
            os.replace(tmp, path)
            write_json_atomic(meta_path, {
                "plan": plan_key(self.spec, which, rank), "runtime": runtime,
                "experiment": self.spec.get("id"), "bytes": path.stat().st_size,
                "made": time.time(),
            })  # fmt: skip
        except OSError:
            tmp.unlink(missing_ok=True)
            return
        evict(self.folder, MAX_BYTES, keep=path)


def evict(where: Path, most: int, keep: Path | None = None, pattern: str = "*.pt") -> list[Path]:
    """Remove the least recently used files of ``pattern`` (each with its ``.json``)
    until the folder holds at most ``most`` bytes of them (never ``keep``, the one just
    made); the removed ones. Also the initial weights' folder's (initial_weights.py)."""
    try:
        files = [(p, p.stat()) for p in where.glob(pattern)]
    except OSError:
        return []
    files.sort(key=lambda f: f[1].st_mtime)
    total = sum(st.st_size for _, st in files)
    gone = []
    for p, st in files:
        if total <= most:
            break
        if keep is not None and p == keep:
            continue
        p.with_suffix(".json").unlink(missing_ok=True)
        p.unlink(missing_ok=True)
        total -= st.st_size
        gone.append(p)
    return gone


def runtime_key(which: str, rng_state, initial: dict, batch) -> dict:
    """What makes two reference steps the same computation, read in the run's process:
    its model's random-number state and initial weights, its batch, its threads, the
    libraries loaded and the CPU."""
    import sys

    import torch

    def digest(data: bytes) -> str:
        return hashlib.sha256(data).hexdigest()

    def tensors(x) -> list:
        if isinstance(x, dict):
            return [t for k in sorted(x) for t in tensors(x[k])]
        if isinstance(x, (tuple, list)):
            return [t for v in x for t in tensors(v)]
        return [x] if isinstance(x, torch.Tensor) else []

    h = hashlib.sha256()
    for t in tensors(batch):
        t = t.detach().cpu()
        h.update(f"{t.dtype}{tuple(t.shape)}".encode())
        h.update(t.reshape(-1).contiguous().view(torch.uint8).numpy().tobytes())
    loaded = {}
    for module in ("intel_extension_for_pytorch", "torch_xla", "transformers", "torchvision"):
        if module in sys.modules:
            loaded[module] = str(getattr(sys.modules[module], "__version__", "?"))
    return {
        "kind": which,
        "rng": digest(rng_state.numpy().tobytes()),
        "initial": digest(json.dumps(initial, sort_keys=True).encode()),
        "batch": h.hexdigest(),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "torch_commit": getattr(torch.version, "git_version", None),
        "loaded": loaded,
        "cpu": cpu_identity(),
    }


def cpu_identity() -> str:
    """The CPU's model and flags (a hash): another CPU may round differently."""
    seen: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key in ("model name", "flags", "Features", "CPU part") and key not in seen:
                    seen[key] = value.strip()
    except OSError:
        import platform

        seen["processor"] = platform.processor() or platform.machine()
    return hashlib.sha256(json.dumps(seen, sort_keys=True).encode()).hexdigest()[:16]
