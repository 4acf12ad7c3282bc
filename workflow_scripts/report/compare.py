"""Like-for-like comparisons: which settings two experiments differ in, each ladder
step against the step it builds on, backends at the same configuration, compiled
against eager, and which comparisons are not like for like at all (another model).

A ratio of throughputs means something when the experiments train the same
workload (:data:`WORKLOAD_KEYS`: model, image size, epochs); every other setting
they differ in is named next to the ratio (:func:`differences`)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from .. import backends
from ..spec import fields
from .uncertainty import between
from .values import isnan

# Every comparison below is read from the field registry (workflow_scripts/study/
# fields.py: each field's comparison role, order, reference and missing value) and the
# backends' own knobs: a knob declared there is compared here with no edit.
# Settings that change what is trained: a throughput ratio across them means nothing.
WORKLOAD_KEYS = fields.compare_keys("workload")
# The torch release each ran: named right after the backend where runs differ in it.
VERSION_KEY = "torch_version"
# Settings that change how it is trained, in the order differences are named.
SETTING_KEYS = tuple(
    k
    for key in fields.compare_keys("setting", "variant", "detail")
    for k in ((key, VERSION_KEY) if key == "backend" else (key,))
)
# What a backend head-to-head holds fixed (everything but the backend's own knobs and
# the details).
CONTROLLED_KEYS = (*WORKLOAD_KEYS, *fields.compare_keys("setting"))
# What a run recorded without a field had (compile none, one rank, ...).
_DEFAULT_OFF = fields.missing_values()
# The plain fp32 eager reference: every optimization knob at its reference value.
REFERENCE = fields.reference_values()
# Every backend's own knobs and their neutral values (``Backend.owns``).
OWNED = {k: v for b in backends.all_backends() for k, v in b.owns.items()}


def norm_setting(key: str, value: Any) -> str:
    if isnan(value):
        value = _DEFAULT_OFF.get(key)
    if value is None:
        return ""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or str(value) in ("True", "False"):
        return "yes" if str(value) == "True" else "no"
    return str(value)


def _short(key: str, value: str) -> str:
    return value.split("+")[0] if key == "torch_version" else value


def differences(a: Mapping, b: Mapping, keys: Sequence[str] = SETTING_KEYS) -> list[str]:
    """The settings ``b`` changes over ``a``, in words: ``precision fp32→bf16``,
    ``+ channels_last``."""
    out = []
    for key in keys:
        va, vb = norm_setting(key, a.get(key)), norm_setting(key, b.get(key))
        if va == vb or (key == "threads" and (not va or not vb)):
            continue
        label = "torch" if key == "torch_version" else key
        if va == "no" and vb == "yes":
            out.append(f"+ {label}")
        elif va == "yes" and vb == "no":
            out.append(f"− {label}")
        else:
            # an unset workload value (a text model's image size) is "none", else unknown
            blank = "none" if key in WORKLOAD_KEYS else "?"
            out.append(f"{label} {_short(key, va) or blank}→{_short(key, vb) or blank}")
    return out


def same_workload(a: Mapping, b: Mapping) -> bool:
    return not differences(a, b, WORKLOAD_KEYS)


def workload_text(row: Mapping) -> str:
    """``resnet50 at 224 px, batch 16, synthetic data``."""
    parts = [norm_setting("model", row.get("model")) or "?"]
    size = norm_setting("image_size", row.get("image_size"))
    if size:
        parts[0] += f" at {size} px"
    batch = norm_setting("batch_size", row.get("batch_size"))
    if batch:
        parts.append(f"batch {batch}")
    data = norm_setting("data", row.get("data"))
    if data:
        parts.append(f"{data} data")
    return ", ".join(parts)


def config_text(row: Mapping) -> str:
    """An experiment's configuration in a few words: backend, precision, layout, launcher."""
    parts = [norm_setting("backend", row.get("backend")) or "?"]
    parts.append(norm_setting("precision", row.get("precision")) or "fp32")
    if norm_setting("channels_last", row.get("channels_last")) == "yes":
        parts.append("channels_last")
    compiled = norm_setting("compile", row.get("compile"))
    if compiled and compiled != "none":
        mode = norm_setting("compile_mode", row.get("compile_mode"))
        mode = f", {mode}" if mode and mode != "default" else ""
        parts.append(f"torch.compile({compiled}{mode})")
    if norm_setting("compile_freezing", row.get("compile_freezing")) == "yes":
        parts.append("frozen")
    if norm_setting("ipex_optimize", row.get("ipex_optimize")) == "yes":
        parts.append("ipex.optimize")
    if norm_setting("ipex_torchscript", row.get("ipex_torchscript")) == "yes":
        parts.append("TorchScript")
    launcher = norm_setting("launcher", row.get("launcher"))
    if launcher and launcher != "none":
        alloc = norm_setting("allocator", row.get("allocator"))
        parts.append(launcher + (f" + {alloc}" if alloc and alloc != "default" else ""))
    ranks = norm_setting("ranks", row.get("ranks"))
    if ranks and ranks != "1":
        parts.append(f"{ranks} ranks")
    return ", ".join(parts)


def previous_steps(ladder: pd.DataFrame) -> pd.DataFrame:
    """Each ladder row against the earlier row it builds on: the one of the same
    workload it differs from in the fewest settings (the latest such on a tie).
    Adds ``step_parent``, ``step_change`` (what differs), ``step_speedup`` and
    ``step_compared`` (its interval and verdict, :mod:`uncertainty`)."""
    out = ladder.copy()
    parents, changes, speedups, compared = [], [], [], []
    rows = [r for _, r in ladder.iterrows()]
    for i, row in enumerate(rows):
        best: tuple[int, int] | None = None
        for j in range(i):
            other = rows[j]
            if not same_workload(other, row):
                continue
            n = len(differences(other, row))
            if best is None or n <= best[0]:
                best = (n, j)
        if best is None:
            parents.append(None)
            changes.append("")
            speedups.append(math.nan)
            compared.append(None)
            continue
        parent = rows[best[1]]
        parents.append(parent["experiment"])
        changes.append(", ".join(differences(parent, row)) or "nothing")
        speedups.append(_ratio(row["sps_median"], parent["sps_median"]))
        compared.append(between(parent, row, "step", changes[-1]))
    out["step_parent"] = parents
    out["step_change"] = changes
    out["step_speedup"] = speedups
    out["step_compared"] = compared
    return out


def _ratio(a: Any, b: Any) -> float:
    if isnan(a) or isnan(b) or float(b) <= 0:
        return math.nan
    return float(a) / float(b)


def variant(row: Mapping) -> str:
    """A backend and its own knobs: ``eager``, ``inductor``, ``ipex + ipex.optimize``,
    ``ipex + compile(ipex)``, with ``compile_mode`` where not the default. A knob a
    backend owns (``Backend.owns``) is named by its label where it is not neutral."""
    backend = norm_setting("backend", row.get("backend")) or "?"
    parts = [backend]
    compiled = norm_setting("compile", row.get("compile"))
    if compiled and compiled not in ("none", backend):
        parts.append(f"compile({compiled})")
    mode = norm_setting("compile_mode", row.get("compile_mode"))
    if compiled != "none" and mode and mode != "default":
        parts.append(mode)
    for knob, neutral in OWNED.items():
        value = norm_setting(knob, row.get(knob))
        if value and value != norm_setting(knob, neutral):
            label = fields.FIELDS[knob].label if knob in fields.FIELDS else None
            parts.append(label or f"{knob}={value}")
    return " + ".join(parts)


def is_reference(row: Mapping) -> bool:
    """A plain fp32 eager run: every optimization knob at the reference's value (a run
    recorded without the field counts as having it)."""
    return all(
        norm_setting(k, row.get(k)) in ("", norm_setting(k, v)) for k, v in REFERENCE.items()
    )


def controlled_key(row: Mapping) -> tuple[str, ...]:
    return tuple(norm_setting(k, row.get(k)) for k in CONTROLLED_KEYS)


def controlled_text(row: Mapping) -> str:
    text = workload_text(row) + f", {norm_setting('precision', row.get('precision')) or 'fp32'}"
    if norm_setting("channels_last", row.get("channels_last")) == "yes":
        text += ", channels_last"
    launcher = norm_setting("launcher", row.get("launcher"))
    if launcher and launcher != "none":
        alloc = norm_setting("allocator", row.get("allocator"))
        text += f", {launcher}" + (f" + {alloc}" if alloc and alloc != "default" else "")
    ranks = norm_setting("ranks", row.get("ranks"))
    if ranks and ranks != "1":
        text += f", {ranks} ranks ({norm_setting('dist_backend', row.get('dist_backend'))})"
    threads = norm_setting("threads", row.get("threads"))
    if threads:
        text += f", {threads} threads"
    return text


def _distinct_texts(keys: list[tuple], keyed: Mapping[tuple, list]) -> dict[tuple, str]:
    """Each configuration's words, told apart where two configurations would read alike
    (e.g. BERT-base on fixed and on dynamically padded batches, or with SGD and AdamW):
    the settings in which they differ are named."""
    texts = {key: controlled_text(keyed[key][0]) for key in keys}
    by_text: dict[str, list[tuple]] = {}
    for key in keys:
        by_text.setdefault(texts[key], []).append(key)
    names = fields.labels()
    for text, same in by_text.items():
        if len(same) < 2:
            continue
        differ = [i for i in range(len(CONTROLLED_KEYS)) if len({k[i] for k in same}) > 1]
        for key in same:
            extra = ", ".join(
                f"{names.get(CONTROLLED_KEYS[i], CONTROLLED_KEYS[i])} {key[i] or 'default'}"
                for i in differ
            )
            texts[key] = f"{text}, {extra}"
    return texts


def backend_matrix(stats: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """Backends at the same configuration: one row per configuration (the
    :data:`CONTROLLED_KEYS`) that two backend variants or more ran, one column per
    variant with its median samples/s, plus the experiment ids. Returns the long frame
    (``config``, ``variant``, ``experiment``, ``sps_median``, ``sps_min``,
    ``sps_max``, ``n_used``, ``torch_version``, ``vs_eager`` and ``compared``: its
    interval and verdict, :mod:`uncertainty`) and the variants' order."""
    rows = []
    if not len(stats):
        return pd.DataFrame(columns=["config", "variant", "experiment"]), []
    keyed: dict[tuple, list] = {}
    for _, r in stats.iterrows():
        keyed.setdefault(controlled_key(r), []).append(r)
    order: list[str] = []
    texts = _distinct_texts([k for k, m in keyed.items() if len({variant(r) for r in m}) > 1],
                            keyed)  # fmt: skip
    for key, members in keyed.items():
        variants = {variant(r) for r in members}
        if len(variants) < 2:
            continue
        best: dict[str, Any] = {}
        for r in members:
            v = variant(r)
            have = best.get(v)
            if have is None or (
                not isnan(r["sps_median"])
                and (isnan(have["sps_median"]) or r["sps_median"] > have["sps_median"])
            ):
                best[v] = r
        eager = best.get("eager")
        for v, r in best.items():
            if v not in order:
                order.append(v)
            rows.append(
                {
                    "config": texts[key],
                    "variant": v,
                    "experiment": r["experiment"],
                    "sps_median": r["sps_median"],
                    "sps_min": r["sps_min"],
                    "sps_max": r["sps_max"],
                    "n_used": r["n_used"],
                    "torch_version": r.get("torch_version"),
                    "vs_eager": _ratio(
                        r["sps_median"], None if eager is None else eager["sps_median"]
                    ),
                    "compared": None
                    if eager is None or v == "eager"
                    else between(eager, r, "backend"),
                }
            )
    first = [v for v in ("eager", "inductor") if v in order]
    order = first + [v for v in order if v not in first]
    return pd.DataFrame(rows), order


def compiled_pairs(stats: pd.DataFrame) -> pd.DataFrame:
    """Each compiled experiment against its eager twin (the same configuration and
    environment, not compiled): ``experiment``, ``eager``, ``speedup``, ``compared``
    (:class:`uncertainty.Comparison`)."""
    rows = []
    plain = stats[stats["compile"].fillna("none") == "none"]
    for _, r in stats[stats["compile"].fillna("none") != "none"].iterrows():
        for _, e in plain.iterrows():
            diff = differences(e, r)
            allowed = {"backend", "compile", "compile_mode", "torch"}
            if not same_workload(e, r) or any(
                d.split(" ")[0].lstrip("+− ") not in allowed for d in diff
            ):
                continue
            if norm_setting("backend", e["backend"]) not in (
                "eager",
                norm_setting("backend", r["backend"]),
            ):
                continue
            rows.append(
                {
                    "experiment": r["experiment"],
                    "eager": e["experiment"],
                    "speedup": _ratio(r["sps_median"], e["sps_median"]),
                    "compared": between(e, r, "compile"),
                }
            )
            break
    return pd.DataFrame(rows, columns=["experiment", "eager", "speedup", "compared"])


def geomean(values: Sequence[float]) -> float:
    finite = [float(v) for v in values if not isnan(v) and float(v) > 0]
    if not finite:
        return math.nan
    return math.exp(sum(math.log(v) for v in finite) / len(finite))


def reference_for(stats: pd.DataFrame, row: Mapping, baseline: str | None) -> pd.Series | None:
    """The fp32 eager reference of ``row``'s workload: the ladder baseline when it is
    the same workload, else the first plain fp32 eager experiment that is."""
    cands = stats[[same_workload(r, row) for _, r in stats.iterrows()]] if len(stats) else stats
    if baseline is not None and (cands["experiment"] == baseline).any():
        return cands[cands["experiment"] == baseline].iloc[0]
    plain = cands[[is_reference(r) for _, r in cands.iterrows()]] if len(cands) else cands
    return plain.iloc[0] if len(plain) else None
