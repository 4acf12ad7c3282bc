"""One-off work once per configuration: what a later trial takes from its experiment's
first trial instead of doing it again.

The comparison of the first step's gradients with fp64 eager's and eager's at the run's
precision (``rank/gradcheck.py``: 13-30 s for a BERT-base or GPT-2 rung on AVX-512) and
the FLOP count (1-2 s) depend on the configuration, not on the trial: the same model,
built from the same seed, on the same batch, through the same code. Trial k > 0 of an
experiment runs after its trial 0 (its record is an ``ancient`` input: a rerun of trial
0 reruns nothing else) and, when trial 0 ended ok with a usable comparison, takes both
from its record. Each trial still checks its own step: every parameter got a finite,
non-zero gradient (the check's cheap half, at its first and first timed step); only the
reference models are not rebuilt. A first trial that failed, or whose check was
incorrect or had no usable comparison, carries nothing: the later trial checks in full.
The record says what it carried and from where (``carried``, and the gradient check's
``comparison_from``).

The FLOP count is the same for every run of one workload (it is one step of one sample on
fake tensors, whatever the run's precision, backend or batch: ``rank/measure.py``), so a
first trial takes it from another experiment's first trial too (:func:`shared_flops`):
the first of a workload to count it leaves it in ``<results>/flops/`` (a side file,
keyed by the environment, model, mode and input shape), and the others carry it from
there (``carried.from`` names that experiment). Deleting the folder only counts again.

The gradient check's reference steps are shared between experiments in the rank
process itself (``rank/references.py``): the same fp64 step for the rungs of one model,
weights and batch.

An INT8 run's calibration, too (:func:`kept_calibration`): where the backend can write
and read one (IPEX's qconf summary: the observed scales), trial 0 keeps it beside its
record (``trial0.int8-calibration.json``, its SHA-256 in the record's
``checks.serving.int8_calibration``) and a later trial quantizes from it instead of
running the calibration batches through the observers again (the same batches, seed and
observers give the same scales; the served model's logits came out bit-identical).
Inductor's PT2E path calibrates in every trial (its observers took 1.2 s of a ResNet-50
trial's setup, its export most of the rest).

A served model's weights, too (:func:`kept_weights`): an inference run that trains its
model first (``epochs``, no ``weights_from``) keeps the weights beside trial 0's record
(``trial0.weights.pt``, its SHA-256 in ``checks.serving.pretrain``), and a later trial
loads them instead of training them again (the same model, seed, data and steps), as
the INT8 rungs that name it in ``weights_from`` do: what the trial measures is the
served model's steps, and it serves the same weights.

A compiled run's compile cache, too (:func:`compile_cache_plan`): trial 0 compiles into
an empty folder beside its record (``compile-cache``, emptied at each of its attempts,
so its compile latency is always a cold one); a later trial starts from a copy of it
(TorchInductor's FX graph and AOTAutograd caches: ResNet-50's first training step took
58 s cold and 6.4 s warm on 2 cores), so only trial 0 pays the compile. The same code
runs either way: the caches are keyed by the graph, the configuration and torch's
own sources. The record's ``provenance.compile_cache`` says which (``fresh``, and
``from``), and the report's compile latency is the cold trials' (``median_cold``).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from ..util import beside_records, read_json, write_json_atomic

#: the folder beside trial 0's record where it leaves its compile cache
CACHE_FOLDER = "compile-cache"
#: the folder beside ``records/`` where first trials leave their FLOP counts
FLOPS_FOLDER = "flops"


def workload_key(spec: dict) -> dict:
    """What a FLOP count depends on: the environment (its torch and transformers), the
    model, the mode and the input's shape (the image size or the sequence length)."""
    return {k: spec.get(k) for k in ("env", "model", "mode", "image_size", "seq_len")}


def flops_path(out: Path, spec: dict) -> Path:
    """Where the FLOP count of ``spec``'s workload is kept, for the record ``out``."""
    key = json.dumps(workload_key(spec), sort_keys=True)
    name = hashlib.sha256(key.encode()).hexdigest()[:16]
    return beside_records(out, FLOPS_FOLDER) / f"{name}.json"


def counted_as_is(record: dict) -> bool:
    """Whether a record's ``flops_per_sample`` is the count itself: with dynamic padding
    it is the count scaled to the lengths the batches were padded to, which a trial that
    took it as its count would scale again (``rank/harness.py``, ``text_metrics``)."""
    spec = record.get("spec") if isinstance(record.get("spec"), dict) else {}
    return spec.get("padding") != "dynamic"


def shared_flops(out: Path, spec: dict) -> dict | None:
    """What a first trial carries from another experiment's first trial of the same
    workload: ``{"flops_per_sample", "from"}``; None where none has counted it."""
    try:
        kept = read_json(flops_path(out, spec), want=None)
    except (OSError, ValueError):
        return None
    if not isinstance(kept, dict) or kept.get("workload") != workload_key(spec):
        return None
    flops = kept.get("flops_per_sample")
    if not isinstance(flops, (int, float)) or isinstance(flops, bool) or not flops > 0:
        return None
    return {"from": f"{kept.get('experiment')} trial 0 (the same workload)",
            "flops_per_sample": float(flops)}  # fmt: skip


def share_flops(out: Path, spec: dict, record: dict) -> None:
    """Leave a first trial's own FLOP count for the other experiments of its workload."""
    metrics = record.get("metrics") if isinstance(record.get("metrics"), dict) else {}
    flops = metrics.get("flops_per_sample")
    counted = metrics.get("flops_count_s")
    if record.get("status") != "ok" or metrics.get("flops_error") or record.get("carried"):
        return
    if not counted_as_is(record):
        return
    if not isinstance(flops, (int, float)) or isinstance(flops, bool) or not flops > 0:
        return
    if not isinstance(counted, (int, float)) or not counted > 0:
        return  # (not counted here)
    try:
        write_json_atomic(flops_path(out, spec), {
            "workload": workload_key(spec), "flops_per_sample": flops,
            "experiment": spec.get("id"), "counted_s": counted,
        })  # fmt: skip
    except OSError:
        pass


def compile_cache_plan(spec: dict, out: Path, trial: int, first_trial: Path | None) -> dict:
    """Where a compiled run's compile cache comes from: ``{"keep": folder}`` for trial 0
    (a cold compile, left for the later trials), ``{"warm_from": folder}`` for a later
    trial whose first trial left one, ``{}`` otherwise (an uncompiled run; a fresh,
    temporary cache)."""
    if spec.get("compile") in (None, "none"):
        return {}
    if trial == 0:
        return {"keep": Path(out).parent / CACHE_FOLDER}
    if first_trial is not None:
        source = Path(first_trial).parent / CACHE_FOLDER
        if source.is_dir() and any(source.iterdir()):
            return {"warm_from": source}
    return {}


def _read(path: Path | None) -> dict | None:
    if path is None:
        return None
    try:
        record = read_json(Path(path), want=None)
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def incorrect_first(path: Path | None) -> str | None:
    """Why a later trial runs nothing, where its first trial's record at ``path`` says
    the configuration's step was incorrect (the gradient check, or a step that trained
    less than eager does): the same model, seed, batch and code give the same step, so a
    later trial would only repeat the verdict at a trial's cost (14-40 s a BERT rung on
    2 vCPUs). None otherwise: a trial 0 that failed or was stopped (a fault, a lost
    job, the clock) leaves the later trials to run and show whether it happens again."""
    from ..rank.harness import INCORRECT

    first = _read(path)
    if first is None or first.get("status") != INCORRECT:
        return None
    error = first.get("error") if isinstance(first.get("error"), dict) else {}
    problem = str(error.get("message") or "the gradient check failed")
    return (
        f"not run: its first trial's step was incorrect ({problem[:400]}), and this trial "
        "would take the same step (the same model, seed, batch and code); the figures "
        f"that step ran at are trial {first.get('trial', 0)}'s unchecked_metrics"
    )


def from_first_trial(path: Path | None) -> tuple[dict | None, dict | None]:
    """What a later trial carries from the first trial's record at ``path`` (for the
    rank: the fp64 gradient's negligible parameters, the FLOP count) and that record;
    (None, None) when it carries nothing."""
    first = _read(path)
    if first is None or first.get("status") != "ok":
        return None, None
    carried: dict[str, Any] = {"from": f"trial {first.get('trial', 0)}"}
    check = first.get("gradient_check")
    comparison = check.get("comparison") if isinstance(check, dict) else None
    if (
        isinstance(check, dict)
        and check.get("ok")
        and isinstance(comparison, dict)
        and not comparison.get("error")
    ):
        carried["negligible"] = list(comparison.get("negligible") or [])
    metrics = first.get("metrics") if isinstance(first.get("metrics"), dict) else {}
    flops = metrics.get("flops_per_sample")
    if (
        isinstance(flops, (int, float))
        and flops > 0
        and not metrics.get("flops_error")
        and counted_as_is(first)
    ):
        carried["flops_per_sample"] = flops
    kept = kept_calibration(Path(path), first)
    if kept:
        carried["int8_calibration"] = kept
    weights = kept_weights(Path(path), first)
    if weights:
        carried["weights"] = weights
    if len(carried) == 1:
        return None, None
    return carried, first


def _serving(first: dict) -> dict:
    """The first trial's record's ``checks.serving`` (an inference run's), else {}."""
    checks = first.get("checks") if isinstance(first.get("checks"), dict) else {}
    serving = checks.get("serving")
    return serving if isinstance(serving, dict) else {}


def kept_calibration(path: Path, first: dict) -> str | None:
    """The INT8 calibration the first trial (its record at ``path``) kept beside its
    record, where the file is the one that record names (its SHA-256: a file that
    another run of the trial left is not carried); None otherwise."""
    from ..rank.inference import calibration_path, file_sha256

    made = _serving(first).get("int8_calibration")
    if not isinstance(made, dict) or not isinstance(made.get("sha256"), str):
        return None
    kept = calibration_path(path)
    try:
        same = kept.is_file() and file_sha256(kept) == made["sha256"]
    except OSError:
        return None
    return str(kept.resolve()) if same else None


def kept_weights(path: Path, first: dict) -> str | None:
    """The weights the first trial (its record at ``path``) trained and kept beside its
    record, where the file is the one that record names (its SHA-256); None otherwise
    (and for a run that loaded its weights from another experiment's)."""
    from ..rank.inference import file_sha256, weights_path

    pretrain = _serving(first).get("pretrain")
    if not isinstance(pretrain, dict) or pretrain.get("weights") != "saved":
        return None
    kept = weights_path(path)
    try:
        same = kept.is_file() and file_sha256(kept) == pretrain.get("weights_sha256")
    except OSError:
        return None
    return str(kept.resolve()) if same else None


def complete(record: dict, carried: dict | None, first: dict | None) -> dict:
    """The later trial's record with what it carried: the first trial's gradient
    comparison beside its own received gradients, and ``carried``."""
    if not carried or first is None:
        return record
    record["carried"] = carried
    check = record.get("gradient_check")
    if "negligible" in carried and isinstance(check, dict):
        check["comparison"] = first["gradient_check"]["comparison"]
        check["comparison_from"] = carried["from"]
    return record
