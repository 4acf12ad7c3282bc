"""The local runtime: a virtualenv on this machine (results/envs/<env>.json)."""

from __future__ import annotations

import os

from .base import REPO_ROOT, Runtime, Wrapped

# Variables that tune a run: a run gets only those its spec (or launcher) asks for.
TUNING_VARS = ("LD_PRELOAD", "OMP_NUM_THREADS", "MALLOC_CONF", "KMP_AFFINITY", "KMP_BLOCKTIME")


class LocalRuntime(Runtime):
    name = "local"

    def environment(self, base: dict | None = None) -> dict[str, str]:
        env = dict(os.environ if base is None else base)
        prefix = self.env_info["prefix"]
        env["VIRTUAL_ENV"] = prefix  # run_cpu looks for allocator/OpenMP libs in $VIRTUAL_ENV/lib
        env["PATH"] = f"{prefix}/bin:{env.get('PATH', '/usr/bin:/bin')}"
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
        env["PYTHONUNBUFFERED"] = "1"
        env.pop("PYTHONHOME", None)
        for key in TUNING_VARS:
            env.pop(key, None)
        return env

    def wrap(self, cmd, env, *, label, mounts=(), cpus=None) -> Wrapped:
        return Wrapped(list(cmd), dict(env))
