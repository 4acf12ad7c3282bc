"""The reference a trial is judged against: the calibration of its environment, made
by the calibrate rule on the node type the study measures."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .. import sysinfo
from ..util import finite, read_json


def measured_on(reference: dict) -> str | None:
    """The node type a reference probe was measured on (None: it does not say)."""
    prov = reference.get("provenance") or {}
    return sysinfo.node_type(prov) if prov.get("cpu_model") else None


def node_reference(
    reference: dict | None, path: Path | None, env_info: dict, log: Path, size: int
) -> dict | None:
    """The reference probe, when it was measured on this node's type; None otherwise.

    The calibrate rule measures it on a node of the type the study's measured jobs ask
    for (on a cluster: the partition and features of the ``cluster`` setting, one node
    type per study). A trial that lands on a node of another type (a partition of
    several CPU models) is not judged by it, and measures nothing of its own either:
    a reference is a rule's output, never a file a trial writes. Its probe signals are
    left out (other work during the steps is still judged), as the log says."""
    if reference is None or path is None or size <= 0:
        return reference
    here = sysinfo.node_type()
    there = measured_on(reference)
    if there in (None, here):
        return reference  # (a reference that does not say where: taken as this node's)
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "a") as logf:
        print(f"[launch] the reference probe {path} was measured on {there}, this node is "
              f"{here}: its probes are not judged (keep a study on one node type: "
              "cluster.partition or cluster.constraint)", file=logf)  # fmt: skip
    return None


#: a calibration's fields that hold lists of measurements, and those that hold mappings
#: (where they hold them: at the top or in a row of a list; deeper, the same name may
#: hold a number or a note, e.g. ``ceiling[].conv.fp32.pilot``, a pilot's GFLOP/s)
_LISTS = {"entries", "ceiling"}
_MAPPINGS = {
    "provenance",
    "train_proxy",
    "text_proxy",
    "sizes",
    "skipped",
    "emulated",
    "pilot",
    "notes",
}
_MAPPINGS_AT = ("", "entries[]", "ceiling[]")
_NUMBERS = {"size", "threads", "repeats", "default_threads"}
_NUMBER_SUFFIXES = ("_gflops", "_s", "_size", "_over_fp32")


def _clean(value: Any, where: str, dropped: list[str]) -> Any:
    """``value`` (a calibration, or part of one) without the fields whose type is not
    the one their name stands for (numbers, lists of mappings, mappings)."""
    if isinstance(value, list):
        return [_clean(v, f"{where}[]", dropped) for v in value]
    if not isinstance(value, dict):
        return value
    out = {}
    for key, item in value.items():
        at = f"{where}.{key}" if where else str(key)
        if key in _LISTS:
            if not isinstance(item, list):
                dropped.append(at)
                continue
            kept = [v for v in item if isinstance(v, dict)]
            if len(kept) < len(item):
                dropped.append(f"{at}[] (not mappings)")
            item = kept
        elif key in _MAPPINGS and where in _MAPPINGS_AT and not isinstance(item, dict | None):
            dropped.append(at)
            continue
        elif (key in _NUMBERS or key.endswith(_NUMBER_SUFFIXES)) and not (
            item is None or finite(item)
        ):
            dropped.append(at)
            continue
        out[key] = _clean(item, at, dropped)
    return out


def clean_calibration(data: dict) -> tuple[dict, list[str]]:
    """A calibration as its readers may use it, and the fields left out because their
    type was wrong (a hand edit, another version): a field a reader needs and cannot
    find means no judgement from it (no noise rerun, no ceiling), never a crash."""
    dropped: list[str] = []
    return _clean(data, "", dropped), dropped


def read_reference(path: Path | None, log: Path | None = None) -> dict | None:
    """The reference probe, or None (with a note in the log) when it cannot be read;
    its fields of the wrong type are left out (noted in the log)."""
    if not path:
        return None
    try:
        data, dropped = clean_calibration(read_json(Path(path)))
    except (OSError, ValueError) as exc:
        _note(log, f"[launch] reference probe {path} unusable ({exc}); no noise reruns")
        return None
    if dropped:
        _note(log, f"[launch] reference probe {path}: fields of the wrong type left out: "
                   f"{', '.join(dropped[:10])}")  # fmt: skip
    return data


def _note(log: Path | None, line: str) -> None:
    if log is not None:
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "a") as logf:
            print(line, file=logf)
