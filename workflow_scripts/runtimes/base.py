"""What a runtime is: where a command runs (a local environment or a container image),
and the one way the study starts a process and waits for it.

:meth:`Runtime.wrap` turns the command lines of a job (a trial's ranks, or the
calibration's probe) and their variables into what the host runs; the trial policy
and the calibration share it. :func:`run_logged` starts that, with its output in
the job's log, its own process group and a time limit. Standard library only.
"""

from __future__ import annotations

import abc
import dataclasses
import os
import signal
import subprocess
import time
from pathlib import Path

from .. import sysinfo

REPO_ROOT = Path(__file__).resolve().parent.parent.parent


@dataclasses.dataclass
class Wrapped:
    """What the host runs: the command, its process environment, and the container
    (if any) to remove afterwards."""

    cmd: list[str]
    env: dict[str, str]
    container: str | None = None


@dataclasses.dataclass
class Finished:
    returncode: int | None
    timed_out: bool
    wall_s: float
    launched_at: str
    ended_at: str


class Runtime(abc.ABC):
    name: str = ""

    def __init__(self, env_info: dict):
        #: the environment record (results/envs/<env>.json) or image record
        #: (results/images/<image>.json) the command runs in
        self.env_info = env_info

    @abc.abstractmethod
    def environment(self, base: dict | None = None) -> dict[str, str]:
        """The run's variables before the spec's: the environment's, no tuning."""

    def missing(self) -> str | None:
        """Why the environment cannot run now (None: it can)."""
        return None

    @abc.abstractmethod
    def wrap(
        self,
        cmd: list[str],
        env: dict[str, str],
        *,
        label: str,
        mounts: list[tuple[str, str]] = (),
        cpus: list[int] | None = None,
    ) -> Wrapped:
        """The command lines of a job as the host runs them."""

    def cleanup(self, wrapped: Wrapped) -> None:  # noqa: B027 - most runtimes leave nothing
        """Remove what :meth:`wrap` left behind (a container)."""


def _kill_group(proc: subprocess.Popen) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=10)
            return
        except subprocess.TimeoutExpired:
            continue


def run_logged(wrapped: Wrapped, log: Path, timeout_s: float) -> Finished:
    """Run a wrapped command with its output appended to ``log``, in its own process
    group (a timeout kills every child), for at most ``timeout_s`` seconds."""
    launched_at = sysinfo.now("microseconds")
    t0 = time.perf_counter()
    timed_out = False
    with open(log, "ab") as logf:
        logf.write(f"$ {' '.join(wrapped.cmd)}\n".encode())
        logf.flush()
        proc = subprocess.Popen(
            wrapped.cmd, stdout=logf, stderr=subprocess.STDOUT, env=wrapped.env, cwd=REPO_ROOT,
            start_new_session=True,
        )  # fmt: skip
        try:
            returncode = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            returncode = proc.returncode
            timed_out = True
        finally:
            if proc.poll() is None:
                _kill_group(proc)
    return Finished(
        returncode=returncode,
        timed_out=timed_out,
        wall_s=time.perf_counter() - t0,
        launched_at=launched_at,
        ended_at=sysinfo.now("microseconds"),
    )
