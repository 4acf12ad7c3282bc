"""Read experiment records and flatten them into one summary row per trial.

A record is the JSON file the harness writes for one trial of one experiment
(``results/records/<experiment>/trial<k>.json``). Records of failed runs may be
partial or malformed; nothing here raises on those. Missing numbers become NaN,
missing text becomes None, and a file that cannot be read or parsed becomes a
record with status ``crashed`` whose error says the record is unreadable.

Noise: each trial's record carries the probe it ran just before its steps (dense
matmul GFLOP/s in fp32 and bf16). :func:`summary_frame` marks a trial ``noisy``
when its fp32 rate is an outlier among the ok trials measured the same way (same
environment, probe size, thread count, ranks and node type, so that a 1-thread trial is
not compared with 2-thread ones, nor torch 2.8 with 2.14), by the trial policy's own
rule (:func:`probe_outliers`): signal "peer probes". Also noisy: a trial whose steps
were more dispersed than its experiment's other trials show ("step times",
:func:`mark_noisy`), and one whose last attempt the trial policy still found disturbed
(its ``noise_check.caught_by``: "probe before steps", "probe after steps", "other work
during steps"). ``noise_signal`` says which signals fired.

Truncation: ``steps_timed`` is how many timed steps ran; ``time_budget_hit`` says the
spec's ``time_budget_s`` stopped them before ``steps``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from .. import outliers, util
from ..spec.fields import COLUMN_FIELDS, DERIVED_KEYS, FIELDS
from ..spec.settings import NOISE_THRESHOLD as DEFAULT_NOISE_THRESHOLD
from ..sysinfo import node_type
from . import results

OK = "ok"
#: a trial that ran whole, whose gradients failed the check (its figures unchecked_metrics)
INCORRECT = "incorrect"
STATUSES = ("ok", "incorrect", "failed", "crashed", "timeout", "oom", "preempted", "node_fail",
            "left_out")  # fmt: skip
UNREADABLE = "UnreadableRecord"

# The columns (results.py declares each result and provenance column once, with its
# kind, unit and help; spec/fields.py the knobs'), in the order of their sections.
MAIN_COLUMNS = results.of("main")
# The accuracy experiments (epochs > 0): time to train, held-out accuracy and loss, and
# the training time until the accuracy first reached the spec's target_accuracy.
ACCURACY_COLUMNS = results.of("accuracy")
# The trial's noise probe, its noise verdict, the reruns and the share of the ceiling.
MEASUREMENT_COLUMNS = results.of("measurement")
# The gradient check (rank/gradcheck.py): its verdict (ok: compared with the eager
# references; received: plain fp32 eager, its gradients present; incorrect), the
# parameter tensors that got a usable gradient of all, the largest relative error of a
# parameter's first-step gradient against fp64 eager and eager's own at the run's
# precision (their median), and the check's seconds (outside the timed steps).
GRADIENT_COLUMNS = results.of("gradient")
# Inference (rank/inference.py): the served model against the fp32 eager model it came
# from (its logits on the run's first batch: their cosine, their largest difference over
# the largest fp32 logit, the share of equal arg-maxes; with epochs, the held-out accuracy of the
# same trained weights: reference_accuracy, and test_accuracy - reference_accuracy),
# the share of oneDNN's multiply-add kernels that ran in INT8 and the CPU feature they
# ran on, and the seconds the backend took to make the served model (quantize, trace).
SERVING_COLUMNS = results.of("serving")
# The spec's fields that have a column (declared in spec/fields.py), then what the
# loader derives (env, preset).
SPEC_COLUMNS = [*COLUMN_FIELDS, *DERIVED_KEYS]
# Versions: Python, torch and torchvision, then each backend's own library.
VERSION_KEYS = results.VERSION_KEYS
PROVENANCE_COLUMNS = results.of("provenance")
ERROR_COLUMNS = results.of("error")
COLUMNS = (
    MAIN_COLUMNS
    + ACCURACY_COLUMNS
    + MEASUREMENT_COLUMNS
    + GRADIENT_COLUMNS
    + SERVING_COLUMNS
    + SPEC_COLUMNS
    + PROVENANCE_COLUMNS
    + ERROR_COLUMNS
)
_COLUMN_SET = set(COLUMNS)
_SHARED = set(SPEC_COLUMNS) & set(results.RESULTS)
if _SHARED:
    raise ValueError(f"columns declared as a field and as a result: {sorted(_SHARED)}")

# Spec columns that hold numbers, from the fields' schemas.
_NUMBER_FIELDS = [n for n in COLUMN_FIELDS if FIELDS[n].numeric]
# Columns that hold numbers (NaN when missing); the rest hold text/bools (None).
NUMERIC_COLUMNS = {
    *(name for name, r in results.RESULTS.items() if r.numeric and name != "trial"),
    *_NUMBER_FIELDS,
}
INTEGER_COLUMNS = {
    *(name for name, r in results.RESULTS.items() if r.integer),
    *(name for name in _NUMBER_FIELDS if FIELDS[name].integer),
}
# The plain figures: read from where they sit in the record, as their kind.
SOURCED = {name: r for name, r in results.RESULTS.items() if r.source}

_STEP_TIME_KEYS = ("median", "p90", "p95", "p99", "stdev", "mean")
_TRIAL_RE = re.compile(r"trial[_-]?(\d+)", re.IGNORECASE)
_TAIL_LINES = 20


def _as_dict(value: Any) -> dict:
    return value if isinstance(value, Mapping) else {}


def _num(value: Any) -> float:
    """A finite-or-NaN float from anything; bools and junk become NaN."""
    if isinstance(value, bool) or value is None:
        return math.nan
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return math.nan
    return math.nan


def _text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, str):
        return value
    return str(value)


def _joined(value: Any, sep: str = " ") -> str | None:
    if value is None:
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, Iterable):
        return sep.join(str(v) for v in value if v is not None)
    return str(value)


def _int_or_nan(value: Any) -> float | int:
    n = _num(value)
    if math.isnan(n):
        return math.nan
    return int(n) if n.is_integer() else n


def _path_identity(path: Path) -> tuple[str, int | None]:
    """(experiment, trial) guessed from ``.../<experiment>/trial<k>.json``."""
    m = _TRIAL_RE.search(path.stem)
    trial = int(m.group(1)) if m else None
    experiment = path.parent.name if m and path.parent.name else path.stem
    return experiment, trial


def _unreadable(path: Path, reason: str, raw: str | None) -> dict:
    experiment, trial = _path_identity(path)
    tail = None
    if raw:
        tail = "\n".join(raw.splitlines()[-_TAIL_LINES:])
    return {
        "experiment": experiment,
        "trial": trial,
        "spec": {"id": experiment},
        "status": "crashed",
        "error": {
            "type": UNREADABLE,
            "message": f"record {path} is unreadable: {reason}",
            "tail": tail,
        },
        "metrics": {},
        "provenance": {},
        "source_path": str(path),
    }


def load_records(paths: Iterable[str | Path]) -> list[dict]:
    """Load records in the given order; unreadable files become crashed records."""
    records: list[dict] = []
    for p in paths:
        path = Path(p)
        raw: str | None = None
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                raw = f.read(util.JSON_MAX_BYTES + 1)
            if len(raw) > util.JSON_MAX_BYTES:
                raise util.UnreadableFile(f"more than {util.JSON_MAX_BYTES} characters")
            data = util.parse_json(raw, "its content")
        except OSError as exc:
            records.append(_unreadable(path, f"{type(exc).__name__}: {exc}", raw))
            continue
        except util.UnreadableFile as exc:
            records.append(_unreadable(path, str(exc), raw))
            continue
        experiment, trial = _path_identity(path)
        spec = _as_dict(data.get("spec"))
        if not data.get("experiment"):
            data["experiment"] = spec.get("id") or experiment
        if data.get("trial") is None and trial is not None:
            data["trial"] = trial
        data.setdefault("source_path", str(path))
        records.append(data)
    return records


def flatten(record: Mapping[str, Any]) -> dict:
    """One summary row (ordered as :data:`COLUMNS`) from one record."""
    record = _as_dict(record)
    spec = _as_dict(record.get("spec"))
    prov = _as_dict(record.get("provenance"))
    row: dict[str, Any] = {}
    row["experiment"] = _text(record.get("experiment") or spec.get("id"))
    row["trial"] = _int_or_nan(record.get("trial"))
    status = record.get("status")
    row["status"] = _text(status) if status else "crashed"
    row.update(_sourced_columns(record))
    row.update(_measured_columns(record, spec, prov))
    row.update(_noise_columns(record))
    row.update(_gradient_columns(record))
    row.update(_serving_columns(record, row))
    row.update(_spec_columns(spec, prov))
    row.update(_provenance_columns(prov))
    row.update(_error_columns(record.get("error")))
    undeclared = row.keys() - _COLUMN_SET
    if undeclared:  # a figure computed here, declared nowhere (results.py)
        raise ValueError(f"summary columns not declared in results.py: {sorted(undeclared)}")
    return {col: row[col] for col in COLUMNS}


def _sourced_columns(record: dict) -> dict:
    """The plain figures (results.py's with a ``source``), each read as its kind."""
    row: dict[str, Any] = {}
    for name, result in SOURCED.items():
        value: Any = record
        for key in result.source:
            value = _as_dict(value).get(key)
        row[name] = _as_kind(value, result.kind)
    return row


def _as_kind(value: Any, kind: str) -> Any:
    if kind == "integer":
        return _int_or_nan(value)
    if kind == "number":
        return _num(value)
    if kind == "flag":
        return value if isinstance(value, bool) else None
    return _text(value)


def _measured_columns(record: dict, spec: dict, prov: dict) -> dict:
    """Throughput, step times, memory, loss, accuracy and the share of the measured ceiling."""
    metrics = _as_dict(record.get("metrics"))
    step = _as_dict(metrics.get("step_time_s"))
    row: dict[str, Any] = {}
    row["samples_per_s"] = _num(metrics.get("samples_per_s"))
    # a text model's throughput in tokens too: its real tokens per sample (without
    # the pads of dynamically padded batches), or seq_len
    tokens = _num(metrics.get("tokens_per_sample"))
    row["tokens_per_sample"] = tokens if not math.isnan(tokens) else _num(spec.get("seq_len"))
    row["tokens_per_s"] = row["samples_per_s"] * row["tokens_per_sample"]
    compiled = _as_dict(_as_dict(record.get("checks")).get("compile"))
    row["compile_s"] = _num(compiled.get("compile_s"))
    row["recompiles"] = _int_or_nan(compiled.get("recompiles_after_first_step"))
    for key in _STEP_TIME_KEYS:
        row[f"step_time_{key}_s"] = _num(step.get(key))
    for key in ACCURACY_COLUMNS:
        row[key] = _num(metrics.get(key)) if spec.get("epochs") else math.nan
    row.update(_share_of_ceiling(metrics, row["samples_per_s"]))
    row["steps_timed"] = _int_or_nan(metrics.get("steps_timed"))
    hit = metrics.get("time_budget_hit")
    row["time_budget_hit"] = hit if isinstance(hit, bool) else None
    mean, stdev = _num(step.get("mean")), _num(step.get("stdev"))
    row["step_time_cv"] = stdev / mean if mean > 0 else math.nan
    row["estimate_s"] = _num(_as_dict(record.get("estimate")).get("seconds"))
    row["attempts"] = _int_or_nan(record.get("attempts"))
    measuring = util.measuring_seconds(metrics)
    row["measuring_s"] = measuring if measuring is not None else math.nan
    timed = util.timed_seconds(metrics)
    row["timed_s"] = timed if timed is not None else math.nan
    discarded = record.get("discarded_attempts")
    row["discarded_attempts"] = len(discarded) if isinstance(discarded, list) else math.nan
    return row


def _gradient_columns(record: dict) -> dict:
    """The gradient check's verdict and figures (rank/gradcheck.py)."""
    check = _as_dict(record.get("gradient_check"))
    got = _as_dict(check.get("received"))
    compared = _as_dict(check.get("comparison"))
    verdict = None
    if check:
        verdict = "incorrect" if not check.get("ok") else ("ok" if compared else "received")
    return {
        "grad_check": verdict,
        "grad_params_trained": _int_or_nan(got.get("with_gradient")),
        "grad_params": _int_or_nan(got.get("parameters")),
        "grad_max_rel_error": _num(compared.get("max_rel_error")),
        "grad_eager_rel_error": _num(compared.get("eager_median_rel_error")),
        "grad_check_s": _num(check.get("check_s")),
    }


def _serving_columns(record: dict, row: dict) -> dict:
    """An inference run's served model against fp32 eager's (see :data:`SERVING_COLUMNS`)."""
    serving = _as_dict(_as_dict(record.get("checks")).get("serving"))
    agreement = _as_dict(serving.get("agreement"))
    onednn = _as_dict(serving.get("onednn"))
    layers = _num(serving.get("weight_layers"))
    int8 = _num(onednn.get("int8_primitives"))
    reference = _num(serving.get("reference_accuracy"))
    scale = _num(agreement.get("reference_max_abs"))
    return {
        "reference_accuracy": reference,
        "accuracy_change": row["test_accuracy"] - reference,
        "logits_cosine": _num(agreement.get("cosine")),
        "logits_rel_diff": _num(agreement.get("max_abs_diff")) / scale if scale > 0 else math.nan,
        "top1_agreement": _num(agreement.get("top1_agreement")),
        "int8_share": min(1.0, int8 / layers) if layers > 0 else math.nan,
        "int8_isa": _text(onednn.get("int8_isa")),
        "serve_s": _num(serving.get("serve_s")),
    }


def _noise_columns(record: dict) -> dict:
    """The probes before and after the steps, other work on the trial's CPUs and the
    trial policy's noise signals."""
    probe = _as_dict(record.get("probe"))
    after = _as_dict(record.get("probe_after"))
    row: dict[str, Any] = {}
    row["noisy"] = False  # set by summary_frame, which sees every trial
    row["probe_fp32_gflops"] = _num(probe.get("fp32_gflops"))
    row["probe_bf16_gflops"] = _num(probe.get("bf16_gflops"))
    row["probe_fp32_median_gflops"] = math.nan
    row["probe_bf16_median_gflops"] = math.nan
    probe_s = [_num(util.probe_seconds(p)) for p in (probe, after) if p]
    row["probe_s"] = sum(probe_s) if probe_s else math.nan
    row["probe_size"] = _int_or_nan(probe.get("size"))
    row["probe_threads"] = _int_or_nan(probe.get("threads"))
    load = probe.get("load_avg_before")
    row["load_avg_1m"] = _num(load[0]) if isinstance(load, list) and load else math.nan
    row["probe_after_fp32_gflops"] = _num(after.get("fp32_gflops"))
    row["other_work_share"] = _num(_as_dict(record.get("other_work")).get("share"))
    check = _as_dict(record.get("noise_check"))
    caught = check.get("caught_by") if check.get("passed") is False else None
    # the trial policy's signals; summary_frame adds the ones that need every trial
    row["noise_signal"] = _joined(caught, "; ") or None
    return row


def _spec_columns(spec: dict, prov: dict) -> dict:
    """The spec's fields (:data:`SPEC_COLUMNS`), its backend and precision, and the
    threads it ran with (torch's own count when the spec left them to torch)."""
    row: dict[str, Any] = {"backend": _text(spec.get("backend"))}
    threads = _int_or_nan(spec.get("threads"))
    if isinstance(threads, float) and math.isnan(threads):
        threads = _int_or_nan(prov.get("torch_num_threads"))
    row["threads"] = threads
    row["precision"] = _text(spec.get("precision"))
    for key in SPEC_COLUMNS:
        value = spec.get(key)
        if key in NUMERIC_COLUMNS:
            row[key] = _int_or_nan(value) if key in INTEGER_COLUMNS else _num(value)
        elif key == "cpus":
            row[key] = _joined(value, ",")
        elif isinstance(value, bool):
            row[key] = value
        else:
            row[key] = _text(value)
    if row.get("env") is None:
        row["env"] = _text(prov.get("env_name"))
    return row


def _provenance_columns(prov: dict) -> dict:
    """Where and how the trial ran: the machine, the process's variables and threads,
    the versions, the environment or image, the revision, the SLURM job."""
    env = _as_dict(prov.get("env"))
    versions = _as_dict(prov.get("versions"))
    row: dict[str, Any] = {}
    row["torch_num_threads"] = _int_or_nan(prov.get("torch_num_threads"))
    row["affinity"] = _joined(prov.get("affinity"), ",")
    row["omp_num_threads"] = _text(env.get("OMP_NUM_THREADS"))
    row["kmp_affinity"] = _text(env.get("KMP_AFFINITY"))
    preload = prov.get("ld_preload")
    row["ld_preload"] = _joined(preload) if preload is not None else _text(env.get("LD_PRELOAD"))
    row["openmp_runtime"] = _text(prov.get("openmp_runtime"))
    row["cpu_model"] = _text(prov.get("cpu_model"))
    row["cpu_flags"] = _joined(prov.get("cpu_flags"))
    row["logical_cpus"] = _int_or_nan(prov.get("logical_cpus"))
    row["physical_cores"] = _int_or_nan(prov.get("physical_cores"))
    row["numa_nodes"] = _int_or_nan(prov.get("numa_nodes"))
    for name in VERSION_KEYS:
        row[f"{name}_version"] = _text(versions.get(name))
    for key in ("env_lock_sha256", "image", "image_id", "image_digest", "runtime", "git_revision"):
        row[key] = _text(prov.get(key))
    fresh = _as_dict(prov.get("compile_cache")).get("fresh")
    row["compile_cache_fresh"] = fresh if isinstance(fresh, bool) else None
    dirty = prov.get("git_dirty")
    row["git_dirty"] = dirty if isinstance(dirty, bool) else _text(dirty)
    row["hostname"] = _text(prov.get("hostname"))
    row["node_type"] = node_type(prov) if prov.get("cpu_model") else None
    row["slurm_job_id"] = _text(_as_dict(prov.get("slurm")).get("job_id"))
    row["started_at"] = _text(prov.get("started_at"))
    return row


def _error_columns(error: Any) -> dict:
    """The error's type and its message with the tail of the output."""
    if isinstance(error, Mapping):
        parts = [_text(error.get("message")), _text(error.get("tail"))]
        text = "\n".join(p for p in parts if p)
        return {"error_type": _text(error.get("type")), "error": text or None}
    if error:
        return {"error_type": None, "error": _text(error)}
    return {"error_type": None, "error": None}


def _share_of_ceiling(metrics: Mapping, sps: float) -> dict:
    """flops_per_sample, achieved GFLOP/s, the calibrated ceiling and the run's % of it.

    Only a share of a calibrated ceiling is a ``pct_of_peak`` (records before the
    ceiling divided by the trial's own noise probe: NaN here), and never one above 100:
    that is a ``measurement_error`` (the trial policy writes it; checked again here)."""
    flops = _num(metrics.get("flops_per_sample"))
    achieved = _num(metrics.get("achieved_gflops"))
    if math.isnan(achieved):
        achieved = flops * sps / 1e9
    ceiling = _num(metrics.get("ceiling_gflops"))
    pct = _num(metrics.get("pct_of_peak")) if ceiling > 0 else math.nan
    error = _text(metrics.get("measurement_error"))
    if pct > 100.0:
        error = error or f"{pct:.0f}% of the calibrated ceiling: above 100 is a measurement error"
        pct = math.nan
    return {
        "flops_per_sample": flops,
        "achieved_gflops": achieved,
        "ceiling_gflops": ceiling,
        "ceiling_dtype": _text(metrics.get("ceiling_dtype")),
        "pct_of_peak": pct,
        "measurement_error": error,
    }


def ceiling_key(record: Mapping[str, Any]) -> tuple | None:
    """What a record's calibrated ceiling is the ceiling of: its node type, dtype and
    threads in all (per rank x ranks, as the trial policy's ``with_ceiling`` counts);
    None without one."""
    record = _as_dict(record)
    metrics = _as_dict(record.get("metrics"))
    rate, dtype = _num(metrics.get("ceiling_gflops")), _text(metrics.get("ceiling_dtype"))
    threads = util.ceiling_threads(record)
    if not rate > 0 or dtype is None or not (threads or 0) > 0:
        return None
    prov = _as_dict(record.get("provenance"))
    return node_type(prov) if prov.get("cpu_model") else None, dtype, threads


def machine_ceilings(rows: list[dict], keys: list[tuple | None]) -> None:
    """Judge each row's share of the ceiling again against the machine's: the best
    ceiling of the same key (:func:`ceiling_key`) among the rows' records, whichever
    environment's calibration measured it. The environments' calibrations measure the
    same CPUs minutes apart, and one taken in a slower minute is no ceiling where
    another measured more: on a 2-vCPU Zen 5 the upstream environment's bf16 ceiling
    read 849.8 GFLOP/s at 2 threads and IPEX's 1000.7, and a frozen bf16 ResNet-50 in
    the upstream environment computed 960 (113 % of its own environment's: no error of
    the FLOP count). A share still above 100 stays a ``measurement_error``."""
    best: dict[tuple, float] = {}
    for row, key in zip(rows, keys):
        if key is not None:
            best[key] = max(best.get(key, 0.0), row["ceiling_gflops"])
    for row, key in zip(rows, keys):
        achieved = row["achieved_gflops"]
        if key is None or not best[key] > row["ceiling_gflops"] or not achieved > 0:
            continue
        rate = row["ceiling_gflops"] = best[key]
        pct = 100.0 * achieved / rate
        row["pct_of_peak"] = pct if pct <= 100.0 else math.nan
        row["measurement_error"] = None
        if pct > 100.0:
            row["measurement_error"] = util.beyond_ceiling(
                pct, rate, "the machine's: the best of the study's calibrations"
            )


def noise_group_keys(frame: pd.DataFrame) -> pd.Series:
    """The comparison group of each trial's probe: environment, probe size, threads,
    ranks (those of one trial probe at once) and node type (probes on different CPU
    models are never compared), as the trial policy's peers (``trial/peers.py``)."""
    cols = ("env", "probe_size", "probe_threads", "ranks", "node_type")
    parts = [frame[c].astype("string").fillna("?") for c in cols if c in frame]
    return parts[0].str.cat(parts[1:], sep="/")


# A trial's steps are dispersed beyond what its configuration shows when their CV is
# above STEP_CV_FACTOR x the lowest CV of the experiment's other ok trials, and above
# STEP_CV_FLOOR (a few % of jitter is every run's).
STEP_CV_FACTOR = 3.0
STEP_CV_FLOOR = 0.10
PEER_PROBES = "peer probes"
STEP_TIMES = "step times"


def step_times_disturbed(frame: pd.DataFrame) -> pd.Series:
    """Ok trials whose step-time CV is far above their experiment's other trials'
    (same experiment and node type; an experiment of one trial has nothing to compare)."""
    cv = pd.to_numeric(frame["step_time_cv"], errors="coerce").astype("float64")
    usable = (frame["status"] == OK) & cv.notna()
    keys = (
        frame["experiment"]
        .astype("string")
        .str.cat(frame["node_type"].astype("string").fillna("?"), sep="@")
    )
    out = pd.Series(False, index=frame.index)
    for _, idx in cv[usable].groupby(keys[usable]).groups.items():
        values = cv[idx]
        for i in idx:
            others = values.drop(i)
            if len(others) and values[i] > max(STEP_CV_FLOOR, STEP_CV_FACTOR * others.min()):
                out[i] = True
    return out


def probe_outliers(frame: pd.DataFrame, keys: pd.Series, threshold: float) -> pd.Series:
    """Ok trials whose fp32 probe is disturbed by the trial policy's own rule
    (``trial/peers.py``), its peers here every other ok trial measured the same way
    (``keys``): below their median by more than their ordinary spread allows and by at
    least ``1 - threshold``; with fewer than 4 of them, below half their median. The
    bf16 probe is not judged: on a 2-vCPU Xeon with AMX one study's bf16 probes read
    374-439 or 772-1,186 GFLOP/s, while the fp32 probes of the same trials were
    ordinary (its low reads were not another process's load)."""
    rate = pd.to_numeric(frame["probe_fp32_gflops"], errors="coerce").astype("float64")
    usable = (frame["status"] == OK) & rate.notna() & (rate > 0)
    out = pd.Series(False, index=frame.index)
    for _, idx in rate[usable].groupby(keys[usable]).groups.items():
        group = rate[idx]
        for i in idx:
            limit = outliers.floor(group.drop(i).tolist(), threshold)
            out[i] = limit is not None and rate[i] < limit
    return out


def mark_noisy(frame: pd.DataFrame, threshold: float = DEFAULT_NOISE_THRESHOLD) -> pd.DataFrame:
    """Fill ``noisy``, ``noise_signal`` and the probe medians (see the module docstring).

    Only ok trials with a probe count towards the medians; a trial is noisy when its
    fp32 rate is an outlier among its group's (:func:`probe_outliers`), when its step
    times are disturbed (:func:`step_times_disturbed`), or when the trial policy's own
    signals still failed on its last attempt (already in ``noise_signal``).
    """
    frame = frame.copy()
    keys = noise_group_keys(frame)
    ok = (frame["status"] == OK).to_numpy()
    for dtype in ("fp32", "bf16"):
        rate = pd.to_numeric(frame[f"probe_{dtype}_gflops"], errors="coerce").astype("float64")
        usable = pd.Series(ok, index=frame.index) & rate.notna() & (rate > 0)
        medians = rate[usable].groupby(keys[usable]).median()
        frame[f"probe_{dtype}_median_gflops"] = keys.map(medians).astype("float64").where(usable)
    peers = probe_outliers(frame, keys, threshold)
    steps = step_times_disturbed(frame)
    signals = []
    for i in frame.index:
        own = frame.at[i, "noise_signal"]
        found = [s for s in str(own).split("; ") if s] if isinstance(own, str) else []
        found += [PEER_PROBES] * bool(peers[i]) + [STEP_TIMES] * bool(steps[i])
        signals.append("; ".join(found) or None)
    frame["noise_signal"] = pd.Series(signals, index=frame.index, dtype=object)
    frame["noisy"] = frame["noise_signal"].notna() & (frame["status"] == OK)
    return frame


def error_parts(record: Mapping[str, Any]) -> tuple[str | None, str | None, str | None]:
    """(type, message, tail) of a record's error, each None when absent."""
    error = _as_dict(record).get("error")
    if isinstance(error, Mapping):
        return _text(error.get("type")), _text(error.get("message")), _text(error.get("tail"))
    if error:
        return None, _text(error), None
    return None, None, None


def summary_frame(
    records: Iterable[Mapping[str, Any]], noise_threshold: float = DEFAULT_NOISE_THRESHOLD
) -> pd.DataFrame:
    """One row per record, in the order given, with :data:`COLUMNS`, noisy trials marked.

    Numeric columns are floats with NaN for missing values, except counts that
    hold only whole numbers, which become nullable integers (``Int64``) so the
    CSV reads ``16`` rather than ``16.0``.
    """
    records = list(records)
    rows = [flatten(r) for r in records]
    machine_ceilings(rows, [ceiling_key(r) for r in records])
    frame = mark_noisy(pd.DataFrame(rows, columns=COLUMNS), noise_threshold)
    for col in ["trial", *NUMERIC_COLUMNS]:
        values = pd.to_numeric(frame[col], errors="coerce").astype("float64")
        if col in INTEGER_COLUMNS:
            present = values.dropna()
            if (present == present.round()).all():
                values = values.astype("Int64")
        frame[col] = values
    return frame.reset_index(drop=True)
