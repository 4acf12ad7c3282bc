"""Folders and files a setting names, checked for what they must be before any job: a
folder the study builds in (``envs_root``, ``containers.wheelhouse``,
``containers.archive``) exists or can be created and is writable; one it reads
(a run's ``data_dir``, another machine's ``report.machines[].results``, a folder or its
summary.csv) exists and is readable; none is a device, a pipe, a socket, a symlink loop
or on a kernel's pseudo-filesystem (``/proc``, ``/sys``, ``/dev``: what reads as files
there are the kernel's, endless or blocking). Each problem is one sentence naming the
path; the caller names the setting."""

from __future__ import annotations

import functools
import os
import stat
from pathlib import Path

#: filesystems whose files are the kernel's, not data
PSEUDO_FILESYSTEMS = frozenset(
    "proc sysfs devtmpfs devpts cgroup cgroup2 debugfs tracefs securityfs pstore bpf "
    "configfs fusectl mqueue hugetlbfs autofs binfmt_misc efivarfs rpc_pipefs nsfs".split()
)


@functools.cache
def _mounts() -> tuple[tuple[str, str], ...]:
    """(mount point, filesystem type) of this process's mounts, longest first (read
    once: every folder setting and run's data folder is looked up in it)."""
    out = []
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                left, _, right = line.partition(" - ")
                fields, kind = left.split(), right.split()
                if len(fields) > 4 and kind:
                    point = fields[4].encode().decode("unicode_escape")
                    out.append((point, kind[0]))
    except OSError:
        return ()
    return tuple(sorted(out, key=lambda m: len(m[0]), reverse=True))


def filesystem_of(path: Path) -> str | None:
    """The type of the filesystem ``path`` (resolved) lies on, or None where unknown."""
    text = str(path)
    for point, kind in _mounts():
        if text == point or text.startswith(point.rstrip("/") + "/"):
            return kind
    return None


def _resolved(path: Path) -> tuple[Path | None, str | None]:
    try:
        return Path(os.path.realpath(path, strict=False)), None
    except (OSError, RuntimeError) as exc:  # a symlink loop
        return None, f"{str(path)!r} cannot be resolved ({exc})"


def _kind_problem(path: Path, info: os.stat_result) -> str | None:
    mode = info.st_mode
    for test, what in (
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISFIFO, "a pipe"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return f"{str(path)!r} is {what}, not a folder or a file of data"
    fs = filesystem_of(path)
    if fs in PSEUDO_FILESYSTEMS:
        return f"{str(path)!r} is on the kernel's {fs} filesystem, not a folder of data"
    return None


def folder_problem(
    path: Path | str, *, write: bool, create: bool, file_ok: bool = False
) -> str | None:
    """Why ``path`` cannot be the folder a setting names, or None: it must be a folder
    (or, ``file_ok``, a regular file) that is readable, and writable where the study
    writes (``write``); one that does not exist yet is fine where the study creates it
    (``create``) under a writable folder."""
    path = Path(path)
    real, problem = _resolved(path)
    if problem:
        return problem
    assert real is not None
    try:
        info = real.stat()
    except FileNotFoundError:
        info = None
    except OSError as exc:
        return f"{str(path)!r} cannot be read ({exc.strerror})"
    if info is None:
        if not create:
            return f"{str(path)!r} does not exist"
        parent = real.parent
        while not parent.exists() and parent != parent.parent:
            parent = parent.parent
        if not parent.is_dir():
            return f"{str(path)!r} cannot be created: {str(parent)!r} is not a folder"
        kind = _kind_problem(parent, parent.stat())
        if kind:
            return kind.replace(f"{str(parent)!r} is", f"{str(path)!r} would be", 1)
        if not os.access(parent, os.W_OK | os.X_OK):
            return f"{str(path)!r} cannot be created: {str(parent)!r} is not writable"
        return None
    kind = _kind_problem(real, info)
    if kind:
        return kind.replace(repr(str(real)), repr(str(path)), 1)
    if stat.S_ISREG(info.st_mode):
        if not file_ok:
            return f"{str(path)!r} is a file, not a folder"
        if not os.access(real, os.R_OK):
            return f"{str(path)!r} is not readable"
        return None
    if not stat.S_ISDIR(info.st_mode):
        return f"{str(path)!r} is neither a folder nor a file"
    if not os.access(real, os.R_OK | os.X_OK):
        return f"{str(path)!r} is not readable"
    if write and not os.access(real, os.W_OK):
        return f"{str(path)!r} is not writable"
    return None
