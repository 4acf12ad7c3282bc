"""Small facts and helpers used on both sides of a run (standard library only).

Everything here runs in the workflow's environment and inside the backend
environments (the harness), so it imports nothing but the standard library.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

# The version of the record layout (results/records/<experiment>/trial<k>.json).
SCHEMA_VERSION = 1


def finite(x: Any) -> bool:
    """A real, finite number (not a bool, not NaN or infinite)."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def int_list(text: str) -> list[int]:
    """``'1024,2048'`` -> ``[1024, 2048]`` (empty items ignored)."""
    return [int(x) for x in text.split(",") if x.strip()]


def write_json_atomic(path: str | os.PathLike, data: Any, indent: int | None = 1) -> None:
    """Write JSON through a temporary file and a rename: a reader never sees half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=indent, default=str) + "\n")
    os.replace(tmp, path)


def tail(path: str | os.PathLike, limit: int = 6000) -> str:
    """The last ``limit`` bytes of a text file, decoded leniently ('' when unreadable)."""
    try:
        data = Path(path).read_bytes()
    except OSError:
        return ""
    return data[-limit:].decode("utf-8", "replace")


def discover(package: str, path: list[str], attr: str, kind: type) -> dict[str, Any]:
    """The plug-ins of a package: for each module but ``base`` and private ones, the
    object named ``attr`` that is a ``kind``, by its ``name``."""
    import importlib
    import pkgutil

    found: dict[str, Any] = {}
    for info in pkgutil.iter_modules(path):
        if info.name == "base" or info.name.startswith("_"):
            continue
        obj = getattr(importlib.import_module(f"{package}.{info.name}"), attr, None)
        if isinstance(obj, kind):
            found[obj.name] = obj
    return found


def lookup(registry: dict[str, Any], name: str, what: str) -> Any:
    try:
        return registry[name]
    except KeyError:
        raise KeyError(f"unknown {what} {name!r}; known: {', '.join(registry)}") from None


def bare(value: Any) -> str:
    """A value as YAML shows it: null, true/false, numbers and strings as they are."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float, str)):
        return str(value)
    return json.dumps(value, default=str)


def show(value: Any) -> str:
    """A value as the user wrote it in YAML, strings quoted (for messages)."""
    return repr(value) if isinstance(value, str) else bare(value)
