"""The container runtimes (podman, docker): a run in its backend's image, by image ID.

A run sees the sources read-only and its record's folder writable (each at its own
host path), no network, the spec's CPUs (``--cpuset-cpus``), the invoking uid:gid,
``HOME=/tmp`` and a ``/dev/shm`` of ``containers.shm_size``; with
``containers.memory``, at most that much memory.

Out of memory: the engine's ``OOMKilled`` says so where it can tell (cgroup v2).
Under cgroup v1 (podman with runc here) it says false, and the container's own memory
cgroup is gone when its process was killed: there the limit is set on a memory
cgroup of the trial's own (``--cgroup-parent``, under the job's), which outlives the
container, and a run killed by SIGKILL while that cgroup was at its limit ran out of
memory.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import tempfile
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


#: what an engine says where it cannot start any container on this host, whatever the
#: image (a host without CAP_SYS_RESOURCE: its default ulimits; crun on hybrid cgroups)
START_FAILURE = re.compile(r"rlimit|cgroups? in hybrid mode|error during container init", re.I)
#: where such a host is told what to give
START_HINT = (
    "a host like this needs podman's settings of containers/engine/containers.conf: "
    "--config container_engine_conf=containers/engine/containers.conf (docs/containers.md)"
)


def engine_works(engine: str, engine_conf: str | None = None) -> tuple[bool, str]:
    """Whether ``engine`` answers (``info``) and, where it holds an image already,
    starts a container of it: an engine that builds and lists images but cannot start
    one here would turn every trial into a crash."""
    if shutil.which(engine) is None:
        return False, f"{engine} not found on PATH"
    env = engine_env(engine_conf)
    try:
        out = subprocess.run([engine, "info"], capture_output=True, text=True, timeout=60, env=env)
    except (OSError, subprocess.SubprocessError) as exc:
        return False, f"`{engine} info` failed: {exc}"
    if out.returncode != 0:
        lines = (out.stderr or out.stdout).strip().splitlines()[-1:] or [""]
        return False, f"`{engine} info` exited {out.returncode}: {lines[0][:200]}"
    return starts(engine, env)


def starts(engine: str, env: dict[str, str]) -> tuple[bool, str]:
    """Whether the engine starts a container of its first image (``true`` in it); with
    no image yet there is nothing to start (the first build says it). Only a failure of
    the start itself (:data:`START_FAILURE`) counts: not an image without ``true``."""
    try:
        listed = subprocess.run([engine, "images", "--quiet", "--filter", "dangling=false"],
                                capture_output=True, text=True, timeout=60, env=env)  # fmt: skip
        ids = listed.stdout.split() if listed.returncode == 0 else []
        if not ids:
            return True, "ok"
        run = subprocess.run([engine, "run", "--rm", "--network", "none", ids[0], "true"],
                             capture_output=True, text=True, timeout=120, env=env)  # fmt: skip
    except (OSError, subprocess.SubprocessError) as exc:
        return False, f"`{engine} run` failed: {exc}"
    said = [line for line in (run.stderr + run.stdout).splitlines() if START_FAILURE.search(line)]
    if run.returncode != 0 and said:
        return (
            False,
            f"`{engine} run` starts no container here ({said[0].strip()[:240]}); {START_HINT}",
        )
    return True, "ok"


def image_exists(engine: str, ref: str, env: dict[str, str]) -> bool:
    proc = subprocess.run([engine, "image", "inspect", ref], capture_output=True, env=env)
    return proc.returncode == 0


def image_archive(info: dict) -> Path | None:
    """Where an image's archive is (the ``containers.archive`` folder), or None."""
    folder = info.get("image_archives")
    return Path(folder) / f"{info['image']}.tar" if folder and info.get("image") else None


def load_archive(info: dict, archive: Path, env: dict[str, str]) -> str:
    """Load an image's archive into this node's engine storage, once per node at a time
    (a lock in this node's /tmp: jobs on one node wait for each other, nodes load in
    parallel). How it went, in words."""
    import fcntl

    lock = Path(tempfile.gettempdir()) / f"study-image-load-{info['image_id'][:16]}.lock"
    with open(lock, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        if image_exists(info["engine"], info["image_id"], env):
            return "(loaded meanwhile by another job on this node)"
        proc = subprocess.run([info["engine"], "load", "-i", str(archive)], capture_output=True,
                              text=True, env=env, timeout=3600)  # fmt: skip
    if proc.returncode != 0:
        return f"failed (exit {proc.returncode}): {(proc.stderr or proc.stdout)[-500:]}"
    return "done"


def run_prefix(
    record: dict,
    name: str,
    mounts: list[tuple[str, str]],
    env: dict[str, str],
    cpus: list[int] | None = None,
    memory: tuple[str, str | None] | None = None,
) -> list[str]:
    """``<engine> run ...`` up to and including the image ID; the command follows.
    mounts: (host path, "ro"|"rw"), mounted at the same path inside, with the
    repository (read-only, the working directory); no network; ``/dev/shm`` of the
    record's ``shm_size``; ``memory``: (limit, the memory cgroup that holds it, or None:
    the engine's --memory)."""
    # no --rm: the container stays until cleanup() (or the watchdog) removes it, so that
    # oom_killed() can still ask the engine how it ended
    cmd = [record["engine"], "run", "--name", name, "--init"]
    cmd += ["--network", "none", "--shm-size", record.get("shm_size") or "2g"]
    cmd += ["--user", f"{os.getuid()}:{os.getgid()}"]
    for path, mode in [(str(REPO_ROOT), "ro"), *mounts]:
        cmd += ["-v", f"{path}:{path}:{mode}"]
    if cpus:
        cmd += ["--cpuset-cpus", ",".join(map(str, cpus))]
    if memory:
        limit, parent = memory
        cmd += ["--cgroup-parent", parent] if parent else ["--memory", limit]
    cmd += ["-w", str(REPO_ROOT)]
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
    shares_host_shm = False
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
        """Why the run cannot start in its image (None: it can). An image this node's
        engine lacks is loaded from its archive first, where there is one (a cluster
        node: the images are built and saved on the submit host)."""
        info = self.env_info
        env = engine_env(info.get("engine_conf"))
        if image_exists(info["engine"], info["image_id"], env):
            return None
        archive = image_archive(info)
        if archive is not None and archive.exists():
            loaded = load_archive(info, archive, env)
            if image_exists(info["engine"], info["image_id"], env):
                return None
            return f"image {info.get('image')} ({info['image_id']}): loading {archive} {loaded}"
        return (
            f"image {info.get('image')} ({info['image_id']}) is not in {info['engine']}'s "
            f"storage; rebuild it: snakemake -R build_image --until "
            f"results/images/{info.get('image')}.json"
            + (f" (and no archive at {archive})" if archive is not None else "")
        )

    def wrap(self, cmd, env, *, label, mounts=(), cpus=None) -> Wrapped:
        name = re.sub(r"[^A-Za-z0-9_.-]", "_", f"study-{label}") + f"-{os.getpid()}"
        limit = self.env_info.get("memory")
        memory = (limit, memory_cgroup(name, limit)) if limit else None
        prefix = run_prefix(self.env_info, name, list(mounts), env, cpus=cpus, memory=memory)
        return Wrapped(
            [*prefix, *cmd], engine_env(self.env_info.get("engine_conf")), name,
            cleanup_cmd=remove_command(self.env_info, name),
            memory_cgroup=memory[1] if memory else None,
        )  # fmt: skip

    def cleanup(self, wrapped: Wrapped) -> None:
        if wrapped.container:
            remove_container(self.env_info, wrapped.container)
        if wrapped.memory_cgroup:
            remove_cgroup(wrapped.memory_cgroup)

    def oom_mark(self) -> int | None:
        return None  # the container has a cgroup of its own: its engine knows

    def oom_killed(self, wrapped: Wrapped, mark: int | None) -> bool:
        if not wrapped.container:
            return False
        engine = self.env_info["engine"]
        env = engine_env(self.env_info.get("engine_conf"))
        # the engine's client can end before the container's exit is recorded (podman,
        # when the kernel killed the container: "Waiting for container ...: no such exit
        # code (container in state running)", and the client exits 127): wait for it
        with contextlib.suppress(subprocess.TimeoutExpired, OSError):
            subprocess.run([engine, "wait", wrapped.container], capture_output=True,
                           timeout=60, env=env)  # fmt: skip
        proc = subprocess.run(
            [engine, "inspect", "--format",
             "{{.State.OOMKilled}} {{.State.ExitCode}} {{.State.Status}}", wrapped.container],
            capture_output=True, text=True, timeout=60, env=env,
        )  # fmt: skip
        said, code, status = [*proc.stdout.strip().lower().split(), "", "", ""][:3]
        if proc.returncode == 0 and said == "true":
            return True
        # killed (SIGKILL), or gone without an exit the engine recorded (its monitor was
        # in the same memory cgroup), while the run's memory cgroup was at its limit
        killed = code == "137" or status not in ("exited", "stopped")
        return killed and bool(wrapped.memory_cgroup) and at_limit(wrapped.memory_cgroup)


# --------------------------------------------------------------------------- memory (v1)

V1_MEMORY = Path("/sys/fs/cgroup/memory")
V1_ROOT = Path("/sys/fs/cgroup")


def _own_v1_memory_path(proc_cgroup: str = "/proc/self/cgroup") -> str | None:
    try:
        for line in Path(proc_cgroup).read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            if "memory" in controllers.split(","):
                return path
    except (OSError, ValueError):
        pass
    return None


def memory_cgroup(name: str, limit: str) -> str | None:
    """Under cgroup v1: a memory cgroup for one run below this process's own, holding
    ``limit`` (its path as ``--cgroup-parent`` takes it); None where that cannot be
    made (cgroup v2, no permission): the engine's own ``--memory`` then."""
    own = _own_v1_memory_path()
    if own is None or not V1_MEMORY.is_dir():
        return None
    path = f"{own.rstrip('/')}/{name}"
    folder = V1_MEMORY / path.lstrip("/")
    try:
        folder.mkdir()
        (folder / "memory.limit_in_bytes").write_text(limit)
    except OSError:
        remove_cgroup(path)
        return None
    return path


def at_limit(path: str) -> bool:
    """The memory cgroup reached its limit (charges failed there)."""
    folder = V1_MEMORY / path.lstrip("/")
    try:
        return int((folder / "memory.failcnt").read_text()) > 0
    except (OSError, ValueError):
        return False


def remove_cgroup(path: str) -> None:
    """The run's cgroup (and what the engine made below and beside it, in every v1
    hierarchy), deepest first."""
    for hierarchy in V1_ROOT.iterdir() if V1_ROOT.is_dir() else []:
        top = hierarchy / path.lstrip("/")
        if not top.is_dir():
            continue
        for folder in sorted((p for p in top.rglob("*") if p.is_dir()), reverse=True):
            with contextlib.suppress(OSError):
                folder.rmdir()
        with contextlib.suppress(OSError):
            top.rmdir()
