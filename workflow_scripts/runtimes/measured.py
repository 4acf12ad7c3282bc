"""The one way the study runs a measured process: a trial's ranks, the calibration's
probe and a collectives benchmark all go through :func:`run_measured`, with the
variables :func:`environment` gives them.

It removes what an earlier run left at the result paths, wraps the command for the
runtime (a container gets the run's ``/dev/shm`` and memory limit, see
:func:`with_limits`), runs it with its output in the job's log and its time limit
(:func:`~.base.run_logged`), turns a run ended by an interrupting signal into
:class:`~.base.Interrupted` (no part of it is read, its results are removed), asks the
runtime whether the kernel's out-of-memory killer ended it, always removes the
container, removes the shared-memory segments its processes left in the host's
/dev/shm (``shm.py``), and reads what each process wrote. The caller merges those
results into its record (a trial through its launcher's ``merge``). Standard library
only.
"""

from __future__ import annotations

import argparse
import dataclasses
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from .. import backends, launchers, shm
from ..commands import Arg
from ..util import read_json
from .base import INTERRUPTS, Finished, Interrupted, Runtime, run_logged, signal_name


def environment(spec: dict, runtime: Runtime, starter: str = "local") -> dict[str, str]:
    """A run's variables: the runtime's, then the launcher's (threads), the backend's,
    and last the spec's own ``env_vars``."""
    env = runtime.environment()
    env.update(launchers.get(spec["launcher"]).environment(spec, starter))
    env.update(backends.get(spec["backend"]).env_vars)
    env.update({str(k): str(v) for k, v in (spec.get("env_vars") or {}).items()})
    return env


@dataclasses.dataclass
class Ran:
    """How a measured process ended and what its processes wrote."""

    #: what the host ran (the command as wrapped by the runtime)
    cmd: list[str]
    finished: Finished
    #: whether it ran in a container (its exit code carries a signal as 128 + n)
    container: bool
    #: the kernel's out-of-memory killer ended it
    oom: bool
    #: each result path's JSON, in order (None: the process wrote nothing there)
    results: list[dict | None]
    #: why a result could not be read (None: all that exist are JSON)
    unreadable: str | None = None
    #: the time limit it ran under (seconds)
    timeout_s: float = 0.0

    @classmethod
    def not_run(cls, now: str) -> Ran:
        """What a run that never started leaves (a record of why it did not)."""
        return cls([], Finished(None, False, 0.0, now, now), False, False, [])

    def problem(self) -> tuple[str, str] | None:
        """Why nothing it wrote can be used, as (kind, message): ``Timeout``,
        ``OutOfMemory`` (the kernel's killer) or ``UnreadableResult``; None when its
        results can be read (each caller then judges them)."""
        if self.finished.timed_out:
            return "Timeout", f"killed after its time limit of {self.timeout_s:g} s"
        if self.oom:
            return "OutOfMemory", f"the kernel's out-of-memory killer ended the run ({self.how})"
        if self.unreadable:
            return "UnreadableResult", self.unreadable
        return None

    @property
    def how(self) -> str:
        """How the process ended, in words."""
        return how_it_ended(self.finished.returncode, self.container)

    @property
    def clean(self) -> bool:
        """It exited 0 within its time."""
        return not self.finished.timed_out and self.finished.returncode == 0


def killed_by(returncode: int | None, container: bool = False) -> int | None:
    """The signal that ended a run: a negative return code, or a container's 128 + n
    (the engine passes its process's death on that way: 137 = SIGKILL, 139 = SIGSEGV)."""
    if returncode is None:
        return None
    if returncode < 0:
        return -returncode
    if container and 128 < returncode < 128 + 65:
        return returncode - 128
    return None


def how_it_ended(returncode: int | None, container: bool = False) -> str:
    sig = killed_by(returncode, container)
    if sig is not None:
        return f"killed by signal {sig} ({signal_name(sig)})"
    return f"exited with code {returncode}"


def interrupted(finished: Finished, container: bool) -> None:
    """A run ended by an interrupting signal (SIGTERM, SIGINT, ...) from outside was
    interrupted, not crashed: raise, so that nothing of it is written."""
    sig = killed_by(finished.returncode, container)
    if sig in INTERRUPTS and not finished.timed_out:  # (a timeout's own kill)
        raise Interrupted(f"the run was interrupted by {signal_name(sig)}", sig)


def _containers(job) -> dict:
    return job.settings.get("containers") or {}


#: The options of a container run's limits (every measured job's), from the study's
#: ``containers`` settings: each rule hands them over with the settings (an empty
#: option: no limit).
LIMIT_ARGS = (
    Arg("shm_size", lambda job: _containers(job)["shm_size"], default="2g",
        help="/dev/shm of a container run"),
    Arg("memory", lambda job: _containers(job).get("memory") or "", default="",
        help="memory limit of a container run (e.g. 8g)"),
    Arg("image_archives", lambda job: _containers(job).get("archive") or "", default="",
        help="folder of saved images, loaded where the engine lacks one"),
)  # fmt: skip


#: The record of the image a measured job runs in (runtime podman or docker), or of
#: its environment (local).
ENV_JSON = Arg(
    "env_json",
    lambda job: job.input.get("image") or job.input.get("env"),
    type=Path,
    help="the record of its image, or of its environment",
)


def with_limits(env_info: dict, args: argparse.Namespace) -> dict:
    """The environment (or image) record with the run's container limits."""
    return {**env_info, "shm_size": args.shm_size, "memory": args.memory or None,
            "image_archives": getattr(args, "image_archives", "") or None}  # fmt: skip


@dataclasses.dataclass(frozen=True)
class Process:
    """A measured process to start: its command line and variables, a ``label`` that
    names its container, the host folders it may write (``mounts``: (path, "rw"|"ro"),
    at the same path inside a container) and the CPUs it may run on (None: the job's)."""

    cmd: Sequence[str]
    env: Mapping[str, str]
    label: str
    mounts: Sequence[tuple[str, str]] = ()
    cpus: list[int] | None = None
    #: fork it from a warm interpreter (``warm.py``): (python, what that imports);
    #: only where the runtime runs the command as it is (local)
    warm: tuple[str, tuple[str, ...]] | None = None


def elastic_logs(runtime: Runtime, cmd: Sequence[str], env: dict[str, str], label: str):
    """torchrun's log folder, for a run it launches on this host: a temporary folder of
    the run's own (``PET_LOG_DIR``, its ``--log-dir``), to remove afterwards; None for
    another command or a container (whose /tmp goes with it). Without one torchrun
    makes ``/tmp/torchelastic_*`` for every run and leaves it (the folders of its ranks'
    logs, empty: the study does not redirect their output there); a day of studies and
    test suites here had left 507."""
    if runtime.name != "local" or "torch.distributed.run" not in cmd:
        return None
    folder = Path(tempfile.mkdtemp(prefix=f"torchelastic-{label}-"))
    env["PET_LOG_DIR"] = str(folder)
    return folder


def run_measured(
    runtime: Runtime, process: Process, *, log: Path, timeout_s: float, results: Sequence[Path]
) -> Ran:
    """Run ``process`` in ``runtime`` and read the JSON its processes write at
    ``results``. Raises :class:`Interrupted` when a signal from outside stopped it (the
    job's or the run's own), after removing its results and its container."""
    cmd, env = list(process.cmd), dict(process.env)
    for path in results:
        path.unlink(missing_ok=True)
    log.parent.mkdir(parents=True, exist_ok=True)
    pids = shm.make_folder() if runtime.shares_host_shm else None
    if pids:  # where the run's oneCCL processes register (what they leave is removed)
        env = {**env, shm.PIDS_VAR: pids}
    elastic = elastic_logs(runtime, cmd, env, process.label)
    wrapped = runtime.wrap(
        cmd, env, label=process.label, mounts=list(process.mounts), cpus=process.cpus
    )
    container = wrapped.container is not None
    if process.warm and not container and wrapped.cmd == cmd:
        wrapped = dataclasses.replace(wrapped, warm=process.warm)
    mark = runtime.oom_mark()
    try:
        finished = run_logged(wrapped, log, timeout_s)
        interrupted(finished, container)
        oom = runtime.oom_killed(wrapped, mark)
    except Interrupted:
        for path in results:  # no part of an unfinished run is ever read
            path.unlink(missing_ok=True)
        raise
    finally:
        runtime.cleanup(wrapped)
        if elastic is not None:
            shutil.rmtree(elastic, ignore_errors=True)
        problems: list[str] = []
        left = shm.cleanup(pids, problems=problems)
        # a killed rank's first-step gradients (another node's: in the cleanup above; a
        # container's went with its /tmp)
        scratch = [n for n in left if n.startswith(shm.SCRATCH_PREFIX)]
        left = [n for n in left if n not in scratch]
        scratch += [] if container else shm.sweep_scratch()
        if left or problems or scratch:
            with open(log, "a") as fh:
                if left:
                    fh.write(f"[shm] removed {len(left)} shared-memory segment(s) the run's "
                             f"processes left in {shm.SHM}: {', '.join(left)}\n")  # fmt: skip
                for problem in problems:
                    fh.write(f"[shm] {problem}\n")
                if scratch:
                    fh.write(f"[gradcheck] removed the first-step gradients of {len(scratch)} "
                             f"stopped check(s): {', '.join(scratch)}\n")  # fmt: skip
    found: list[dict | None] = []
    unreadable = None
    for path in results:
        try:
            found.append(read_json(path, want=None) if path.exists() else None)
        except (OSError, ValueError) as exc:
            found.append(None)
            unreadable = unreadable or f"{path.name}: {exc}"
        path.unlink(missing_ok=True)
    return Ran(wrapped.cmd, finished, container, oom, found, unreadable, timeout_s)
