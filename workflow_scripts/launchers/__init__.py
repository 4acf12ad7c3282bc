"""The launchers: one module each (``launchers/<name>.py`` defining ``LAUNCHER``), named
by the value of the ``launcher`` field. Standard library only at import time."""

from __future__ import annotations

import functools

from ..util import discover, lookup
from .base import ENTRY, Launcher, harness_args, nodes, rank_path, result_paths, starter

__all__ = [
    "ENTRY",
    "Launcher",
    "all_launchers",
    "get",
    "harness_args",
    "layout_launcher",
    "names",
    "nodes",
    "rank_path",
    "result_paths",
    "starter",
]


@functools.cache
def _registry() -> dict[str, Launcher]:
    found = discover(__name__, __path__, "LAUNCHER", Launcher)
    # "none" (no launcher, the default) first, then in their declared order
    return dict(sorted(found.items(), key=lambda kv: (kv[0] != "none", kv[1].order, kv[0])))


def all_launchers() -> list[Launcher]:
    return list(_registry().values())


def names() -> list[str]:
    return list(_registry())


def layout_launcher() -> Launcher:
    """The launcher of the data-parallel layouts and the allreduce benchmark (the one
    with ``layouts``)."""
    found = [launcher for launcher in all_launchers() if launcher.layouts]
    if len(found) != 1:
        raise RuntimeError(f"one launcher must have layouts; found {[f.name for f in found]}")
    return found[0]


def layout_names() -> set[str]:
    """The ``launcher`` values whose runs are data-parallel layouts."""
    return {launcher.name for launcher in all_launchers() if launcher.layouts}


def get(name: str) -> Launcher:
    return lookup(_registry(), name, "launcher")
