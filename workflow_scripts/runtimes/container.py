"""The container runtimes (podman, docker): a run in its backend's image, by image ID.

A run sees the sources read-only and its record's folder writable (each at its own
host path), no network, the spec's CPUs (``--cpuset-cpus``), the invoking uid:gid,
``HOME=/tmp`` and a ``/dev/shm`` of ``containers.shm_size``.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

from .base import REPO_ROOT, Runtime, Wrapped

ENGINES = ("podman", "docker")


def engine_env(engine_conf: str | None) -> dict[str, str]:
    """The engine's process environment: CONTAINERS_CONF (podman) only when the study
    asks for a host-specific containers.conf; BuildKit for docker (23+ has it on)."""
    env = dict(os.environ)
    env.setdefault("DOCKER_BUILDKIT", "1")  # docker: --build-context and RUN --mount
    if engine_conf:
        env["CONTAINERS_CONF"] = str(Path(engine_conf).resolve())
    return env


def engine_works(engine: str, engine_conf: str | None = None) -> tuple[bool, str]:
    if shutil.which(engine) is None:
        return False, f"{engine} not found on PATH"
    try:
        out = subprocess.run(
            [engine, "info"], capture_output=True, text=True, timeout=60,
            env=engine_env(engine_conf),
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError) as exc:
        return False, f"`{engine} info` failed: {exc}"
    if out.returncode != 0:
        lines = (out.stderr or out.stdout).strip().splitlines()[-1:] or [""]
        return False, f"`{engine} info` exited {out.returncode}: {lines[0][:200]}"
    return True, "ok"


def image_exists(engine: str, ref: str, env: dict[str, str]) -> bool:
    proc = subprocess.run([engine, "image", "inspect", ref], capture_output=True, env=env)
    return proc.returncode == 0


def run_prefix(
    record: dict,
    name: str,
    mounts: list[tuple[str, str]],
    env: dict[str, str],
    cpus: list[int] | None = None,
    shm_size: str = "2g",
    network: bool = False,
    workdir: str | None = None,
) -> list[str]:
    """``<engine> run ...`` up to and including the image ID; the command follows.
    mounts: (host path, "ro"|"rw"), mounted at the same path inside."""
    # no --rm: the container stays until cleanup() (or the watchdog) removes it, so that
    # oom_killed() can still ask the engine how it ended
    cmd = [record["engine"], "run", "--name", name, "--init"]
    cmd += ["--network", "host" if network else "none", "--shm-size", shm_size]
    cmd += ["--user", f"{os.getuid()}:{os.getgid()}"]
    for path, mode in mounts:
        cmd += ["-v", f"{path}:{path}:{mode}"]
    if cpus:
        cmd += ["--cpuset-cpus", ",".join(map(str, cpus))]
    if workdir:
        cmd += ["-w", workdir]
    for key, value in sorted(env.items()):
        cmd += ["-e", f"{key}={value}"]
    return [*cmd, record["image_id"]]


def remove_command(record: dict, name: str) -> list[str]:
    engine = record["engine"]
    return (
        [engine, "rm", "-f", "-t", "0", name] if engine == "podman" else [engine, "rm", "-f", name]
    )


def remove_container(record: dict, name: str) -> None:
    cmd = remove_command(record, name)
    subprocess.run(cmd, capture_output=True, env=engine_env(record.get("engine_conf")), timeout=120)


class ContainerRuntime(Runtime):
    """A run inside the image of an image record (results/images/<image>.json)."""

    @property
    def name(self) -> str:  # podman or docker
        return self.env_info["engine"]

    def environment(self, base: dict | None = None) -> dict[str, str]:
        """The image's environment, nothing from the host."""
        prefix = self.env_info["prefix"]
        return {
            "VIRTUAL_ENV": prefix,
            "PATH": f"{prefix}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "PYTHONPATH": str(REPO_ROOT),
            "PYTHONUNBUFFERED": "1",
            "HOME": "/tmp",  # a writable home for any uid (runs use the invoking user's)
        }

    def missing(self) -> str | None:
        info = self.env_info
        env = engine_env(info.get("engine_conf"))
        if image_exists(info["engine"], info["image_id"], env):
            return None
        return (
            f"image {info.get('image')} ({info['image_id']}) is not in {info['engine']}'s "
            f"storage; rebuild it: snakemake -R build_image --until "
            f"results/images/{info.get('image')}.json"
        )

    def wrap(self, cmd, env, *, label, mounts=(), cpus=None) -> Wrapped:
        name = re.sub(r"[^A-Za-z0-9_.-]", "_", f"study-{label}") + f"-{os.getpid()}"
        prefix = run_prefix(
            self.env_info, name, [(str(REPO_ROOT), "ro"), *mounts], env, cpus=cpus,
            shm_size=self.env_info.get("shm_size", "2g"), workdir=str(REPO_ROOT),
        )  # fmt: skip
        return Wrapped(
            [*prefix, *cmd], engine_env(self.env_info.get("engine_conf")), name,
            cleanup_cmd=remove_command(self.env_info, name),
        )  # fmt: skip

    def cleanup(self, wrapped: Wrapped) -> None:
        if wrapped.container:
            remove_container(self.env_info, wrapped.container)

    def oom_mark(self) -> int | None:
        return None  # the container has a cgroup of its own: its engine knows

    def oom_killed(self, wrapped: Wrapped, mark: int | None) -> bool:
        if not wrapped.container:
            return False
        engine = self.env_info["engine"]
        proc = subprocess.run(
            [engine, "inspect", "--format", "{{.State.OOMKilled}}", wrapped.container],
            capture_output=True, text=True, timeout=60,
            env=engine_env(self.env_info.get("engine_conf")),
        )  # fmt: skip
        return proc.returncode == 0 and proc.stdout.strip().lower() == "true"
