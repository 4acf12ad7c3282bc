"""Shared-memory segments a run's processes leave behind in /dev/shm.

oneCCL's shm transport goes through libfabric's shm provider, whose segments are
files in /dev/shm named ``<pid>:<n>:<n>`` (the creating process's id first, 64 MiB
each here). libfabric unlinks them at a clean shutdown or from its signal handlers,
never after SIGKILL, which a timed-out, interrupted or failed run gets: on a node they
stay in RAM until reboot, and a stale name can break a later start.

So each process that loads oneCCL registers its pid in the run's folder
(:data:`PIDS_VAR`, made by the measured runtime for a local run, :func:`register`),
and when the run has ended (or its watchdog has stopped it), :func:`cleanup` removes
the segments of those pids, and only of those, and only of the ones that are gone (a
pid the system has since given to another process is left alone). A container run
has its own /dev/shm, which goes with the container. Shared by both sides (the ranks
register, the host removes); standard library only: the watchdog imports it too.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
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


def register(pid: int | None = None) -> None:
    """This process (or ``pid``) may create segments: note it in the run's folder (no
    folder, e.g. outside a measured run or in a container: nothing to do)."""
    folder = os.environ.get(PIDS_VAR)
    if not folder:
        return
    try:
        Path(folder, str(pid or os.getpid())).touch()
    except OSError:
        pass  # (a folder that is gone or not ours: the run goes on)


def registered(folder: str | os.PathLike) -> set[int]:
    try:
        return {int(p.name) for p in Path(folder).iterdir() if p.name.isdigit()}
    except OSError:
        return set()


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


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


def cleanup(folder: str | os.PathLike | None, root: Path = SHM) -> list[str]:
    """After a run: remove what its registered processes left, then the folder."""
    if not folder:
        return []
    removed = remove(registered(folder), root)
    shutil.rmtree(folder, ignore_errors=True)
    return removed
