"""What a runtime is: where a command runs (a local environment or a container image),
and the one way the study starts a process and waits for it.

:meth:`Runtime.wrap` turns the command lines of a job (a trial's ranks, the
calibration's probe, a collectives benchmark) and their variables into what the host
runs, and :func:`run_logged` starts that, with its output in the job's log, its own
process group and a time limit; ``measured.run_measured`` is the one place that does
both for a measured job. Standard library only.

Nothing outlives its job: the command runs in a process group of its own, which is
killed when it ends (stragglers included), when it runs out of time, when the job
process gets SIGTERM, SIGINT, SIGHUP or SIGQUIT, and when whoever started the job
(under Snakemake: the job's shell and Snakemake itself) is gone; a watchdog process
(``watchdog.py``) does the same when the job process itself is SIGKILLed. An
interruption raises :class:`Interrupted`: the caller writes no result, so a rerun
repeats exactly the unfinished work.
"""

from __future__ import annotations

import abc
import contextlib
import dataclasses
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from .. import sysinfo
from . import warm

REPO_ROOT = Path(__file__).resolve().parent.parent.parent


@dataclasses.dataclass
class Wrapped:
    """What the host runs: the command, its process environment, and the container
    (if any) to remove afterwards."""

    cmd: list[str]
    env: dict[str, str]
    container: str | None = None
    #: what removes the container when its client was killed (run by the watchdog)
    cleanup_cmd: list[str] | None = None
    #: the v1 memory cgroup holding a container run's memory limit (removed afterwards)
    memory_cgroup: str | None = None
    #: start it forked from a warm interpreter (``warm.py``): (python, what it imports)
    warm: tuple[str, tuple[str, ...]] | None = None


@dataclasses.dataclass
class Finished:
    returncode: int | None
    timed_out: bool
    wall_s: float
    launched_at: str
    ended_at: str
    #: forked from a warm interpreter (``warm.py``), not started fresh
    warm: bool = False


class Runtime(abc.ABC):
    name: str = ""
    #: its runs share the host's /dev/shm (a container has its own, gone with it)
    shares_host_shm: bool = True

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

    def oom_mark(self) -> int | None:
        """Before a run: the kernel's count of out-of-memory kills in this job's memory
        cgroup (None: not readable)."""
        return cgroup_oom_kills()

    def oom_killed(self, wrapped: Wrapped, mark: int | None) -> bool:
        """After a run (before :meth:`cleanup`): did the out-of-memory killer end it?"""
        after = cgroup_oom_kills()
        return mark is not None and after is not None and after > mark


def cgroup_oom_kills(proc_cgroup: str = "/proc/self/cgroup") -> int | None:
    """The ``oom_kill`` count of this process's memory cgroup (v2 ``memory.events``,
    v1 ``memory.oom_control``), None where it cannot be read."""
    try:
        lines = Path(proc_cgroup).read_text().splitlines()
    except OSError:
        return None
    candidates = []
    for line in lines:
        hierarchy, controllers, path = line.split(":", 2)
        path = path.lstrip("/")
        if "memory" in controllers.split(","):
            candidates.append(Path("/sys/fs/cgroup/memory", path, "memory.oom_control"))
        elif hierarchy == "0" and not controllers:
            candidates.append(Path("/sys/fs/cgroup", path, "memory.events"))
            candidates.append(Path("/sys/fs/cgroup/unified", path, "memory.events"))
    for file in candidates:
        try:
            for entry in file.read_text().splitlines():
                key, _, value = entry.partition(" ")
                if key == "oom_kill":
                    return int(value)
        except (OSError, ValueError):
            continue
    return None


#: the signals that interrupt a job (a crash or an out-of-memory kill is not one)
INTERRUPTS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)
#: how many processes above the job process are watched (the job's shell, Snakemake)
LIFELINE_LEVELS = 2
LIFELINE_VAR = "STUDY_LIFELINE_LEVELS"
POLL_S = 0.5
WATCHDOG = Path(__file__).with_name("watchdog.py")


class Interrupted(Exception):  # noqa: N818 - named for what happened, like KeyboardInterrupt
    """The job was interrupted: a signal to it, or whoever started it is gone. The
    command was stopped; no result may be written."""

    def __init__(self, why: str, signum: int | None = None):
        super().__init__(why)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum if self.signum else 1


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"  # real-time and unnamed signals


def _parent(pid: int) -> int | None:
    fields = sysinfo.proc_stat(pid)
    return int(fields[1]) if fields else None


class Lifeline:
    """The processes above this one, by PID and start time (a reused PID is not the
    same process): ``lost()`` says which one is gone."""

    def __init__(self, levels: int | None = None):
        if levels is None:
            levels = int(os.environ.get(LIFELINE_VAR) or LIFELINE_LEVELS)
        self.watched: list[tuple[int, str]] = []
        pid = os.getppid()
        for _ in range(levels):
            if pid is None or pid <= 1:
                break
            start = sysinfo.start_time(pid)
            if start is None:
                break
            self.watched.append((pid, start))
            pid = _parent(pid)

    def lost(self) -> str | None:
        for pid, start in self.watched:
            if sysinfo.start_time(pid) != start:
                return f"the process that started the job (PID {pid}) is gone"
        return None


@contextlib.contextmanager
def interruptible():
    """While inside, the interrupting signals raise :class:`Interrupted` (in the main
    thread; elsewhere the default handlers stay)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, _frame):
        raise Interrupted(f"interrupted by {signal_name(signum)}", signum)

    previous = {}
    try:
        for sig in INTERRUPTS:
            previous[sig] = signal.signal(sig, handler)
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def _start_watchdog(cleanup_cmd: list[str] | None, env: dict) -> subprocess.Popen | None:
    """The watchdog, started before the command: it waits for the command's process
    group on its input (:func:`_watch`)."""
    try:
        return subprocess.Popen(
            [sys.executable, str(WATCHDOG), str(os.getpid()),
             json.dumps(cleanup_cmd) if cleanup_cmd else ""],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            env={**os.environ, **env}, start_new_session=True, text=True,
        )  # fmt: skip
    except OSError:
        return None


def _tell_watchdog(watchdog: subprocess.Popen | None):
    """What the command's child runs before its program (``preexec_fn``, after
    ``setsid``): it writes its own process group to the watchdog. So the watchdog knows
    the group before the command runs; told by the parent after ``Popen`` returned, a
    parent descheduled in between and then SIGKILLed left a running command unwatched."""
    if watchdog is None:
        return None
    fd = watchdog.stdin.fileno()

    def tell() -> None:
        with contextlib.suppress(OSError):
            os.write(fd, b"%d\n" % os.getpgrp())

    return tell


def _watch(watchdog: subprocess.Popen | None, pgid: int) -> None:
    """The parent's side: the same line again (the watchdog reads the first), and the
    end of its input."""
    if watchdog is None:
        return
    with contextlib.suppress(OSError, ValueError):
        watchdog.stdin.write(f"{pgid}\n")
        watchdog.stdin.close()


def _start_warm(wrapped: Wrapped, logf, watchdog: subprocess.Popen | None, owner):
    """The command forked from its warm interpreter (``warm.py``), or None (said in the
    log): then it starts cold."""
    python, modules = wrapped.warm
    tell = watchdog.stdin.fileno() if watchdog is not None else None
    proc = warm.start(
        python, modules, wrapped.cmd, wrapped.env, str(REPO_ROOT), logf.fileno(), tell, owner
    )
    if isinstance(proc, str):
        logf.write(f"[warm] started fresh: {proc}\n".encode())
        logf.flush()
        return None
    return proc


def _kill_stragglers(pgid: int) -> None:
    """What the command left behind in its process group (e.g. a worker it did not wait
    for) goes with it."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


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


def exit_watch(proc) -> int | None:
    """A file descriptor that becomes readable when ``proc`` exits (Linux's pidfd), or
    None where there is none (a warm run, which waits on its connection; an older kernel)."""
    if not isinstance(proc, subprocess.Popen) or not hasattr(os, "pidfd_open"):
        return None
    try:
        return os.pidfd_open(proc.pid)
    except OSError:  # Linux < 5.3, or a seccomp profile without it
        return None


def wait_quietly(proc, pidfd: int | None, timeout: float) -> int:
    """``proc.wait(timeout)`` without waking meanwhile: Popen's own wait with a timeout
    polls (sleeps of 1 to 50 ms: about 30 wake-ups a second), and every wake-up of this
    process takes a CPU from the run's threads (2 threads on 2 CPUs: each one preempts
    a step); a pidfd is waited on whole. Raises ``subprocess.TimeoutExpired`` alike."""
    if pidfd is None:
        return proc.wait(timeout=timeout)
    ready, _, _ = select.select([pidfd], [], [], max(0.0, timeout))
    if not ready:
        raise subprocess.TimeoutExpired(proc.args, timeout)
    return proc.wait()


def run_logged(wrapped: Wrapped, log: Path, timeout_s: float) -> Finished:
    """Run a wrapped command with its output appended to ``log``, in its own process
    group (a timeout kills every child), for at most ``timeout_s`` seconds; raise
    :class:`Interrupted` (after stopping it) when the job is interrupted."""
    launched_at = sysinfo.now("microseconds")
    t0 = time.perf_counter()
    timed_out = False
    lifeline = Lifeline()
    with interruptible(), open(log, "ab") as logf:
        logf.write(f"$ {' '.join(wrapped.cmd)}\n".encode())
        logf.flush()
        proc = watchdog = pidfd = None
        try:
            # the watchdog first, so that the command never runs unwatched
            watchdog = _start_watchdog(wrapped.cleanup_cmd, wrapped.env)
            owner = lifeline.watched[-1] if lifeline.watched else None
            proc = _start_warm(wrapped, logf, watchdog, owner) if wrapped.warm else None
            if proc is None:
                proc = subprocess.Popen(
                    wrapped.cmd, stdout=logf, stderr=subprocess.STDOUT, env=wrapped.env,
                    cwd=REPO_ROOT, start_new_session=True, preexec_fn=_tell_watchdog(watchdog),
                )  # fmt: skip
            _watch(watchdog, proc.pid)
            pidfd = exit_watch(proc)
            deadline = t0 + timeout_s
            while True:
                left = deadline - time.perf_counter()
                try:
                    returncode = wait_quietly(proc, pidfd, max(0.0, min(POLL_S, left)))
                    break
                except subprocess.TimeoutExpired:
                    if left <= 0:
                        _kill_group(proc)
                        returncode = proc.returncode
                        timed_out = True
                        break
                    why = lifeline.lost()
                    if why:
                        raise Interrupted(why) from None
        except Interrupted as exc:
            logf.write(f"[launch] {exc}: stopping the run\n".encode())
            raise
        finally:
            if pidfd is not None:
                os.close(pidfd)
            if proc is not None:
                if proc.poll() is None:
                    _kill_group(proc)
                _kill_stragglers(proc.pid)
            if watchdog is not None:
                watchdog.kill()
                watchdog.wait()
    return Finished(
        returncode=returncode,
        timed_out=timed_out,
        wall_s=time.perf_counter() - t0,
        launched_at=launched_at,
        ended_at=sysinfo.now("microseconds"),
        warm=isinstance(proc, warm.WarmProcess),
    )
