"""Small facts and helpers used on both sides of a run (standard library only).

Everything here runs in the workflow's environment and inside the backend
environments (the harness), so it imports nothing but the standard library.
"""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path
from typing import Any

# The version of the record layout (results/records/<experiment>/trial<k>.json).
SCHEMA_VERSION = 1


def finite(x: Any) -> bool:
    """A real, finite number (not a bool, not NaN or infinite)."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def ceiling_threads(record: dict) -> float | None:
    """The threads a record's ceiling is for: all of its run's (per rank x ranks)."""
    checks, spec = record.get("checks") or {}, record.get("spec") or {}
    threads = checks.get("threads") or spec.get("threads")
    return threads * (checks.get("world_size") or 1) if finite(threads) else None


def beyond_ceiling(pct: float, rate: float, how: str) -> str:
    """The ``measurement_error`` of a share ``pct`` above 100 of the ceiling ``rate``."""
    return (
        f"{pct:.0f}% of the calibrated ceiling ({rate:.1f} GFLOP/s, {how}): a run cannot "
        "compute faster than the machine's best dense kernel, so the FLOP count or the "
        "ceiling is wrong"
    )


def beside_records(out: Path | str, name: str) -> Path:
    """A study's side folder ``name`` for the trial record ``out``:
    ``<results>/records/<experiment>/trial<k>.json`` -> ``<results>/<name>``; a record
    elsewhere: ``<name>`` beside its folder."""
    records = Path(out).parent.parent
    return (records.parent if records.name == "records" else records) / name


def _step_time(metrics: dict, statistic: str) -> Any:
    dist = metrics.get("step_time_s")
    return dist.get(statistic) if isinstance(dist, dict) else None


def first_step_one_off(metrics: Any) -> float:
    """The first step's one-off costs (allocation, lazy initialisation, compilation): its
    time beyond a steady step (the median timed step) where the record says both; the
    whole first step where no timed step says what a steady one takes."""
    if not isinstance(metrics, dict):
        return 0.0
    first = metrics.get("time_to_first_step_s")
    if not finite(first) or first <= 0:
        return 0.0
    steady = _step_time(metrics, "median")
    if finite(steady) and steady > 0:
        return max(0.0, float(first) - float(steady))
    return float(first)


def measuring_seconds(metrics: Any) -> float | None:
    """How long a trial measured (a record's ``metrics``): its step loop, scoring and
    checking left out, that is its warm-up steps and timed steps, less the first step's
    one-off costs (:func:`first_step_one_off`: the first step is a warm-up step as long
    as a steady one); None where the record does not say."""
    if not isinstance(metrics, dict):
        return None
    loop = metrics.get("train_time_s")
    if not finite(loop) or loop <= 0:
        return None
    return max(0.0, float(loop) - first_step_one_off(metrics))


def probe_seconds(probe: Any) -> float | None:
    """A probe's seconds, with those of the probes taken again before it and the pauses
    between them (``reprobed``, rank/measure.py); None where it does not say."""
    if not isinstance(probe, dict) or not finite(probe.get("seconds")):
        return None
    again = probe.get("reprobed")
    extra = again.get("seconds") if isinstance(again, dict) else None
    return float(probe["seconds"]) + (float(extra) if finite(extra) and extra > 0 else 0.0)


def timed_seconds(metrics: Any) -> float | None:
    """How long a trial's timed steps took (a record's ``metrics``: their mean times their
    number), never more than :func:`measuring_seconds`, which holds them; None where the
    record does not say either."""
    measuring = measuring_seconds(metrics)
    if measuring is None:
        return None
    mean = _step_time(metrics, "mean")
    n = metrics.get("steps_timed")
    if not finite(mean) or not finite(n) or mean <= 0 or n <= 0:
        return None
    return min(float(mean) * float(n), measuring)


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


#: how much of a value a message quotes (a config's value, a file's content)
EXCERPT_CHARS = 120


def _excerpt(text: str, limit: int = EXCERPT_CHARS) -> str:
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def bare(value: Any) -> str:
    """A value as YAML shows it: null, true/false, numbers and strings as they are;
    at most :data:`EXCERPT_CHARS` of it (a message never spells out a huge value, nor
    one that YAML aliases nest into itself)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float, str)):
        return _excerpt(str(value))
    if shape_problem(value, max_nodes=64, max_depth=8) is None:
        return _excerpt(json.dumps(value, default=str))
    import reprlib

    short = reprlib.Repr()
    short.maxlevel, short.maxlist, short.maxdict, short.maxstring = 3, 4, 4, 40
    return _excerpt(short.repr(value))


def show(value: Any) -> str:
    """A value as the user wrote it in YAML, strings quoted (for messages), with what is
    not ASCII as escapes: an id whose 'a' is a Cyrillic look-alike reads 'b\\u0430seline'
    (and a line break '\\n'), never as a value that looks right."""
    return _excerpt(ascii(value)) if isinstance(value, str) else bare(value)


def shape_problem(value: Any, max_nodes: int, max_depth: int) -> str | None:
    """Why ``value`` (parsed JSON or YAML) is too big to handle, or None: more than
    ``max_nodes`` values counted as a reader walks them (a YAML alias counted each time
    it is used), or lists and mappings nested deeper than ``max_depth``. The walk stops
    at the limit, so its cost is bounded whatever the value."""
    nodes = 0
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        nodes += 1
        if nodes > max_nodes:
            return f"more than {max_nodes} values (YAML aliases count each time they are used)"
        if isinstance(item, dict):
            children = list(item.keys()) + list(item.values())
        elif isinstance(item, (list, tuple)):
            children = list(item)
        else:
            continue
        if depth + 1 > max_depth and children:
            return f"lists or mappings nested deeper than {max_depth} levels"
        stack.extend((c, depth + 1) for c in children[: max_nodes - nodes + 1])
    return None


#: the limits on a JSON file the workflow reads (a record, a calibration, a build's
#: marker, another machine's results): far beyond any file it writes itself
JSON_MAX_BYTES = 64 * 1024 * 1024
JSON_MAX_DEPTH = 64
JSON_MAX_NODES = 5_000_000


class UnreadableFile(ValueError):
    """A file that cannot be used: its message names the file and why, in one line."""


def read_json(path: str | os.PathLike, *, want: type | None = dict) -> Any:
    """A JSON file's content, or :class:`UnreadableFile` naming the file and why: it
    cannot be read, is larger than :data:`JSON_MAX_BYTES`, is not JSON (truncated,
    corrupt), nests deeper than :data:`JSON_MAX_DEPTH` or is not a ``want`` (a JSON
    object by default). Never a traceback for what a file holds."""
    path = Path(path)
    try:
        size = path.stat().st_size
        if size > JSON_MAX_BYTES:
            raise UnreadableFile(f"{path}: {size} bytes, more than {JSON_MAX_BYTES}")
        with open(path, encoding="utf-8", errors="replace") as f:
            raw = f.read(JSON_MAX_BYTES + 1)
    except OSError as exc:
        raise UnreadableFile(f"{path}: cannot be read ({exc.strerror or exc})") from None
    return parse_json(raw, str(path), want=want)


def parse_json(raw: str, name: str, *, want: type | None = dict) -> Any:
    """:func:`read_json` for text already read (``name`` says where it came from)."""
    try:
        data = json.loads(raw)
    except RecursionError:
        raise UnreadableFile(f"{name}: nested too deeply to parse") from None
    except ValueError as exc:
        raise UnreadableFile(f"{name}: not valid JSON ({_excerpt(str(exc))})") from None
    problem = shape_problem(data, JSON_MAX_NODES, JSON_MAX_DEPTH)
    if problem:
        raise UnreadableFile(f"{name}: {problem}")
    if want is not None and not isinstance(data, want):
        kind = {dict: "a JSON object", list: "a JSON list"}.get(want, want.__name__)
        raise UnreadableFile(f"{name}: expected {kind}, got {type(data).__name__}")
    return data


#: a hashed lock's pin, continuation lines joined: ``name==version --hash=sha256:...``
_PIN = re.compile(r"([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)((?:\s+--hash=sha256:[0-9a-f]{64})+)")


def lock_pins(lock: Path) -> list[tuple[str, str, set[str]]] | None:
    """A hashed lock's pins: (name, version, the sha256s it allows) each; None where a
    line is anything else (an option, a marker, extras, a URL: pip reads those)."""
    pins = []
    for line in lock.read_text().replace("\\\n", " ").splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        m = _PIN.fullmatch(line)
        if m is None:
            return None
        pins.append((m[1], m[2], set(re.findall(r"sha256:([0-9a-f]{64})", m[3]))))
    return pins
