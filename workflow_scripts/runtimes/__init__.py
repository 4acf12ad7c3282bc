"""Where the study's processes run: ``local`` (virtualenvs), ``podman`` or ``docker``
(the backends' images). ``auto`` is resolved once per Snakemake invocation
(:func:`resolve`), and every job reads the answer instead of asking the engine again.
Standard library only."""

from __future__ import annotations

import os

from .base import (
    Finished,
    Interrupted,
    Runtime,
    Wrapped,
    run_logged,
    signal_name,
)
from .container import ENGINES, ContainerRuntime, engine_env, engine_works
from .local import LocalRuntime

__all__ = [
    "ENGINES", "RUNTIMES", "ContainerRuntime", "Finished", "Interrupted", "LocalRuntime", "Runtime",
    "RuntimeUnavailable", "Wrapped", "engine_env", "for_env", "image_provenance", "in_container",
    "resolve",
    "run_logged", "signal_name",
]  # fmt: skip

RUNTIMES = ("auto", "local", *ENGINES)
# The answer of the invocation's first resolve(), inherited by its jobs' processes.
RESOLVED_VAR = "STUDY_RUNTIME_RESOLVED"


class RuntimeUnavailable(RuntimeError):
    """An explicitly requested engine does not work here."""


def resolve(requested: str, engine_conf: str | None = None) -> tuple[str, str | None]:
    """(runtime, note): auto takes podman if it works, else docker, else local (with a
    note saying why). An explicitly requested engine that does not work is an error.

    The answer is kept in the process environment (``STUDY_RUNTIME_RESOLVED``), so
    the jobs that Snakemake starts, which parse the workflow again, do not ask the
    engine again."""
    cached = _cached(requested, engine_conf)
    if cached is not None:
        return cached, None
    runtime, note = _resolve(requested, engine_conf)
    os.environ[RESOLVED_VAR] = f"{requested}|{engine_conf or ''}={runtime}"
    return runtime, note


def _cached(requested: str, engine_conf: str | None) -> str | None:
    key = f"{requested}|{engine_conf or ''}="
    cached = os.environ.get(RESOLVED_VAR, "")
    return cached[len(key) :] if cached.startswith(key) else None


def resolved(requested: str, engine_conf: str | None = None) -> str | None:
    """What ``requested`` was resolved to in this process or the Snakemake that started
    it (:func:`resolve`), without asking an engine: None where it was not yet."""
    return requested if requested != "auto" else _cached(requested, engine_conf)


def _resolve(requested: str, engine_conf: str | None) -> tuple[str, str | None]:
    if requested == "local":
        return "local", None
    if requested in ENGINES:
        ok, why = engine_works(requested, engine_conf)
        if not ok:
            raise RuntimeUnavailable(f"runtime {requested} requested, but {why}")
        return requested, None
    reasons = []
    for engine in ENGINES:
        ok, why = engine_works(engine, engine_conf)
        if ok:
            return engine, None
        reasons.append(why)
    return "local", (
        "runtime auto: no working container engine (" + "; ".join(reasons) + "); "
        "running every experiment locally in virtualenvs. Set runtime: local to silence this."
    )


def in_container(env_info: dict) -> bool:
    """An image record (results/images/<image>.json) rather than a local environment."""
    return bool(env_info.get("image_id") and env_info.get("engine"))


def image_provenance(env_info: dict) -> dict:
    """The image a record ran in (None each for a local environment)."""
    return {k: env_info.get(k) for k in ("image", "image_id", "image_digest")}


def for_env(env_info: dict) -> Runtime:
    """The runtime of an environment or image record."""
    return ContainerRuntime(env_info) if in_container(env_info) else LocalRuntime(env_info)
