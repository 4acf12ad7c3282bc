"""The reference a trial is judged against: the calibration of its environment, made
by the calibrate rule on the node type the study measures."""

from __future__ import annotations

from pathlib import Path

from .. import sysinfo
from ..calibration import clean_calibration
from ..util import read_json


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
