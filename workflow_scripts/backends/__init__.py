"""The backends: one module each, found by name (``backends/<name>.py`` defining ``BACKEND``).

Adding a backend is a module here, its lock in ``envs/`` and its Containerfile in
``containers/<image>/`` (see docs/extending.md). Everything else (the
``backend`` field's allowed values, the ``compile`` values, the images, the
environments, the version columns, the report's order) is read from these objects.
Standard library only at import time.
"""

from __future__ import annotations

import functools

from ..util import discover, lookup
from .base import Backend

__all__ = ["Backend", "all_backends", "get", "names"]


@functools.cache
def _registry() -> dict[str, Backend]:
    found = discover(__name__, __path__, "BACKEND", Backend)
    return dict(sorted(found.items(), key=lambda kv: (kv[1].order, kv[0])))


def all_backends() -> list[Backend]:
    """Every backend, in the report's order."""
    return list(_registry().values())


def names() -> list[str]:
    return list(_registry())


def get(name: str) -> Backend:
    return lookup(_registry(), name, "backend")


def compile_values() -> list[str]:
    """The ``compile`` values some backend can run, besides ``none``."""
    values: list[str] = []
    for b in all_backends():
        for v in (b.default_compile, *b.compile_options):
            if v != "none" and v not in values:
                values.append(v)
    return values


def env_imports(env: str) -> list[str]:
    """The modules a trial in environment ``env`` imports at setup (calibration too)."""
    return list(dict.fromkeys(m for b in all_backends() if b.env == env for m in b.imports))


def version_modules() -> dict[str, str]:
    """Backend libraries whose versions records report: module -> key."""
    return {m: k for b in all_backends() for m, k in b.versions.items()}
