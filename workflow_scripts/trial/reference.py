"""The reference a trial is judged against: the calibration of its environment, and of
the node type it runs on (a cluster node of another CPU model calibrates once)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from .. import calibration, sysinfo


def measured_on(reference: dict) -> str | None:
    """The node type a reference probe was measured on (None: it does not say)."""
    prov = reference.get("provenance") or {}
    return sysinfo.node_type(prov) if prov.get("cpu_model") else None


def node_reference(
    reference: dict | None, path: Path | None, env_info: dict, log: Path, size: int
) -> dict | None:
    """The reference probe of this node's type. The calibration job measured one on the
    node it ran on; a trial on a node of another type (a cluster of several CPU models)
    measures this type's own, once per environment and node type, with the node to
    itself (its job is exclusive), next to the calibration as
    ``<env>.<node type>.json``, and compares with that."""
    if reference is None or path is None or size <= 0:
        return reference
    here = sysinfo.node_type()
    if measured_on(reference) in (None, here):
        return reference  # (a reference that does not say where: taken as this node's)
    own = path.with_name(f"{path.stem}.{re.sub(r'[^A-Za-z0-9._-]+', '_', here)}.json")
    if own.exists():
        return read_reference(own, log)
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "a") as logf:
        print(f"[launch] the calibration ran on another node type; measuring this one's "
              f"reference ({here}) into {own}", file=logf)  # fmt: skip
    result = calibration.calibrate(env_info, own, log.with_suffix(".calibration.log"), [size])
    return None if result.get("error") else result


def read_reference(path: Path | None, log: Path | None = None) -> dict | None:
    """The reference probe, or None (with a note in the log) when it cannot be read."""
    if not path:
        return None
    try:
        data = json.loads(Path(path).read_text())
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
        return data
    except (OSError, ValueError) as exc:
        if log is not None:
            log.parent.mkdir(parents=True, exist_ok=True)
            with open(log, "a") as logf:
                print(f"[launch] reference probe {path} unusable ({exc}); no noise reruns",
                      file=logf)  # fmt: skip
        return None
