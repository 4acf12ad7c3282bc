"""Shared-memory segments a run's processes leave behind in /dev/shm.

oneCCL's shm transport goes through libfabric's shm provider, whose segments are
files in /dev/shm named ``<pid>:<n>:<n>`` (the creating process's id first, 64 MiB
each here). libfabric unlinks them at a clean shutdown or from its signal handlers,
never after SIGKILL, which a timed-out, interrupted or failed run gets: on a node they
stay in RAM until reboot, and a stale name can break a later start.

So each process that loads oneCCL registers its pid in the run's folder
(:data:`PIDS_VAR`, made by the measured runtime for a local run, :func:`register`),
under its host's name (``<folder>/<host>/<pid>``: a pid means something only on its own
host), and when the run has ended (or its watchdog has stopped it), :func:`cleanup`
removes the segments of those pids, and only of those, and only of the ones that are
gone (a pid the system has since given to another process is left alone). The ranks
of a several-node trial on the other nodes of its SLURM job register in a folder of the
same path on their node (its own ``/tmp``); :func:`cleanup` then runs itself on every
node of the job too (an ``srun`` step: ``python shm.py <folder>``), each node removing
what its own processes left. A container run has its own /dev/shm, which goes with the
container. Shared by both sides (the ranks register, the host removes); standard
library only: the watchdog imports it too.

The same cleanup takes the gradient check's first-step folders (``rank/gradcheck.py``):
a check keeps the first step's gradients, as large as the model, in
``<temp>/gradcheck-<host>-<pid>-*`` until its verdict, and a rank killed before it
leaves them. :func:`sweep_scratch` removes those of this host's processes that are
gone: after every local run (``runtimes/measured.py``), on every node of a several-node
job (the same step), and before a check makes its own folder.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path

#: the folder where a run's processes register their pids
PIDS_VAR = "STUDY_RUN_PIDS_DIR"
SHM = Path("/dev/shm")
#: libfabric's shm provider: ``<pid>:<endpoint>:<n>``
SEGMENT = re.compile(r"^(\d+):\d+:\d+$")


def make_folder() -> str:
    """A new folder for one run's pids."""
    return tempfile.mkdtemp(prefix="study-run-pids-")


def host() -> str:
    """The name this host's registrations go under (a node of a test cluster, with a
    host name of its own but the machine's /tmp, has a folder of its own too)."""
    return socket.gethostname() or "localhost"


#: the gradient check's first-step folders: ``<temp>/gradcheck-<host>-<pid>-<random>``
SCRATCH_PREFIX = "gradcheck-"


def scratch_prefix(pid: int | None = None) -> str:
    """The name of this host's first-step folders (of ``pid``'s, when given) begins so."""
    mine = f"{SCRATCH_PREFIX}{host().replace('-', '_')}-"
    return mine if pid is None else f"{mine}{pid}-"


def scratch_pid(name: str) -> int | None:
    """The pid in a first-step folder's name (``gradcheck-<host>-<pid>-*``), if any."""
    parts = name.removeprefix(SCRATCH_PREFIX).split("-")
    return int(parts[1]) if len(parts) >= 3 and parts[1].isdigit() else None


def sweep_scratch(root: str | os.PathLike | None = None) -> list[str]:
    """Remove the first-step folders in ``root`` (the temporary folder) of this host's
    processes that are gone: only this user's, only this host's (another node may share
    the folder), only where the pid no longer runs; the names removed."""
    root = Path(root or tempfile.gettempdir())
    mine = scratch_prefix()
    removed = []
    try:
        entries = [p for p in root.iterdir() if p.name.startswith(mine)]
    except OSError:
        return removed
    for path in entries:
        pid = scratch_pid(path.name)
        try:
            ours = path.is_dir() and path.stat().st_uid == os.getuid()
        except OSError:
            continue
        if ours and pid is not None and not alive(pid):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path.name)
    return removed


def register(pid: int | None = None) -> None:
    """This process (or ``pid``) may create segments: note it in the run's folder, under
    this host (no folder, e.g. outside a measured run or in a container: nothing to do;
    on another node of the run's SLURM job the folder is made there)."""
    folder = os.environ.get(PIDS_VAR)
    if not folder:
        return
    try:
        mine = Path(folder, host())
        mine.mkdir(parents=True, exist_ok=True)
        (mine / str(pid or os.getpid())).touch()
    except OSError:
        pass  # (a folder that is gone or not ours: the run goes on)


def registered(folder: str | os.PathLike) -> set[int]:
    """The pids registered in ``folder`` by processes of this host."""
    try:
        return {int(p.name) for p in Path(folder, host()).iterdir() if p.name.isdigit()}
    except OSError:
        return set()


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, exited but not yet reaped, does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat[stat.rindex(")") + 2 :].split(" ", 1)[0] != "Z"
    except (OSError, ValueError):
        return True


#: how long a cleanup waits for a registered process that is still exiting (a rank of
#: another node whose step has ended, but that SLURM has not reaped yet)
EXIT_WAIT_S = 5.0


def segments(pids: Iterable[int], root: Path = SHM) -> list[Path]:
    """The segments of these pids in ``root``."""
    pids = set(pids)
    try:
        entries = list(root.iterdir())
    except OSError:
        return []
    return sorted(p for p in entries if (m := SEGMENT.match(p.name)) and int(m.group(1)) in pids)


def remove(pids: Iterable[int], root: Path = SHM) -> list[str]:
    """Remove the segments of those of ``pids`` that are gone; their names."""
    removed = []
    for path in segments([p for p in pids if not alive(p)], root):
        try:
            path.unlink()
            removed.append(path.name)
        except OSError:
            continue
    return removed


def wait_gone(pids: Iterable[int], timeout_s: float = EXIT_WAIT_S) -> None:
    """Wait up to ``timeout_s`` for those of ``pids`` that still run (and have segments)
    to exit."""
    deadline = time.monotonic() + timeout_s
    waiting = [p for p in pids if alive(p)]
    while waiting and time.monotonic() < deadline:
        time.sleep(0.1)
        waiting = [p for p in waiting if alive(p)]


def cleanup_here(folder: str | os.PathLike, root: Path = SHM) -> list[str]:
    """On this host: remove what its registered processes left (once they have exited,
    waiting a little for those still exiting), then its part of the folder (and the
    folder, once no host has a part left in it)."""
    pids = registered(folder)
    wait_gone([int(m.group(1)) for p in segments(pids, root) if (m := SEGMENT.match(p.name))])
    removed = remove(pids, root)
    shutil.rmtree(Path(folder, host()), ignore_errors=True)
    try:
        os.rmdir(folder)
    except OSError:
        pass  # another host's part is still there (a filesystem the nodes share)
    return removed


#: how long the cleanup step on a job's other nodes may take
SPREAD_TIMEOUT_S = 120


def job_nodes(environ=None) -> int:
    """The nodes of the SLURM job this process runs in (1 outside one). A job of the
    Snakemake executor plugin runs in its inner ``srun``, which drops SLURM's variables
    but the job's id: then SLURM is asked (``squeue``)."""
    env = os.environ if environ is None else environ
    try:
        given = env.get("SLURM_JOB_NUM_NODES") or env.get("SLURM_NNODES")
        if given:
            return int(given)
    except ValueError:
        return 1
    job = env.get("SLURM_JOB_ID")
    if not job or not job.isdigit():
        return 1
    try:
        out = subprocess.run(["squeue", "-h", "-j", job, "-o", "%D"], capture_output=True,
                             text=True, timeout=30, check=False).stdout.split()  # fmt: skip
        return int(out[0]) if out and out[0].isdigit() else 1
    except (OSError, subprocess.TimeoutExpired):
        return 1


def spread_command(folder: str | os.PathLike, nodes: int) -> list[str]:
    """The ``srun`` step that runs the cleanup on every node of this job, once a node
    (``--overlap``: beside whatever still holds the job's CPUs; ``--mpi=none``: it
    needs no MPI plugin of the site's)."""
    return ["srun", f"--nodes={nodes}", f"--ntasks={nodes}", "--ntasks-per-node=1",
            "--overlap", "--mpi=none", "--cpu-bind=none", "--kill-on-bad-exit=0",
            sys.executable, os.path.abspath(__file__), str(folder)]  # fmt: skip


def cleanup(
    folder: str | os.PathLike | None, root: Path = SHM, problems: list[str] | None = None
) -> list[str]:
    """After a run: remove what its registered processes left; their segments' names
    (another node's as ``<name> on <host>``). In a SLURM job of several nodes, every
    node does its own part (:func:`spread_command`); a step that could not run is added
    to ``problems``, for the run's log."""
    if not folder:
        return []
    removed = []
    nodes = job_nodes()
    if nodes > 1 and root == SHM:
        why = None
        try:
            step = subprocess.run(spread_command(folder, nodes), capture_output=True,
                                  text=True, timeout=SPREAD_TIMEOUT_S, check=False)  # fmt: skip
            for line in step.stdout.splitlines():  # (this node's part too: its task ran)
                where, _, names = line.partition(" ")
                on = "" if where == host() else f" on {where}"
                removed += [f"{n}{on}" for n in names.split()]
            if step.returncode != 0:
                why = f"failed ({step.returncode}): {step.stderr.strip()[-300:]}"
        except (OSError, subprocess.TimeoutExpired) as exc:
            why = f"did not run: {exc}"
        if why and problems is not None:
            problems.append(f"the cleanup step on the job's {nodes} nodes {why}")
    return cleanup_here(folder, root) + removed


def main(argv: list[str]) -> int:
    """``python shm.py <folder>``: this host's part of a run's cleanup (one task of the
    step :func:`spread_command` starts): its segments and first-step folders; prints
    ``<host> <name> ...``."""
    if len(argv) != 1:
        print("usage: python shm.py <run folder>", file=sys.stderr)
        return 2
    print(host(), *cleanup_here(argv[0]), *sweep_scratch(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
