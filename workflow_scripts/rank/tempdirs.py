"""The temporary folders a trial's process made as it imported and ran, removed as it
ends.

A rank ends with ``os._exit`` (``run_trial._exit_now``: no interpreter teardown), so
the clean-up that Python's ``atexit`` and finalizers would do is skipped, and each
process left its folders in the temporary folder: importing ``torch._dynamo`` (which
torchvision and transformers do) makes one for RemoteModule's generated code
(``torch.distributed.nn.jit.instantiator``, a ``TemporaryDirectory``), and
multiprocessing makes its ``pymp-*`` folder once a DataLoader's workers share file
descriptors (each worker its own: the workers are ended first, :func:`on_exit`, and
remove theirs as they end). A day of studies and test suites here had left 644
``tmp*`` and 59 ``pymp-*`` folders in /tmp. A process forked from one that imported
already (the warm interpreter, ``runtimes/warm.py``) leaves its parent's folders alone:
:func:`inherit`. (Inductor's compile pool, a process of its own that IPEX's import
starts under torch 2.8, still leaves its folder: it is killed with the trial's process
group, and ending it cleanly took 1.0 s.)
"""

from __future__ import annotations

import contextlib
import shutil
import sys
from collections.abc import Callable

_INHERITED: set[str] = set()
_CLOSERS: list[Callable[[], None]] = []


def on_exit(closer: Callable[[], None]) -> None:
    """Call ``closer`` as the process ends, before its folders are removed (a
    DataLoader's workers, ended so that each removes its own folder)."""
    _CLOSERS.append(closer)


def made() -> list[str]:
    """The folders this process's modules made and would remove at a normal exit."""
    found = []
    instantiator = sys.modules.get("torch.distributed.nn.jit.instantiator")
    name = getattr(getattr(instantiator, "_TEMP_DIR", None), "name", None)
    if isinstance(name, str):
        found.append(name)
    process = sys.modules.get("multiprocessing.process")
    config = getattr(process.current_process(), "_config", {}) if process else {}
    if isinstance(config.get("tempdir"), str):
        found.append(config["tempdir"])
    return found


def inherit() -> None:
    """In a process forked from one that imported: what is made so far is the parent's."""
    _INHERITED.update(made())


def remove() -> None:
    """End what :func:`on_exit` was given, then remove this process's own folders (never
    raises: the process is ending)."""
    while _CLOSERS:
        with contextlib.suppress(Exception):
            _CLOSERS.pop()()
    for path in made():
        if path not in _INHERITED:
            shutil.rmtree(path, ignore_errors=True)
