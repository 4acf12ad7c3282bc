"""The one way every rule enters the project's code.

A rule's ``run:`` block calls :func:`run` with the module that does its work. The
module declares its entry point's parameters once (its ``COMMAND``, a
:class:`~workflow_scripts.commands.Command`: each :class:`~workflow_scripts.commands.Arg` names
its option and where the rule's job has its value), which turns Snakemake's objects
into its command line, and its ``main`` (parsing with the same declaration) then runs
as ``python -m workflow_scripts.jobs <module> <argv>``, in a process of its own:

- any failure of the entry point (an exception, ``SystemExit`` from ``argparse`` or
  ``sys.exit``, a non-zero return) ends that process with a non-zero exit, and the
  job fails at once with the entry point's message. Inside Snakemake's worker thread a
  ``SystemExit`` is no exception Snakemake catches: the job never ended and the
  workflow waited for ever, ignoring SIGTERM;
- the process has a main thread, where the study's signal handlers can be installed
  (Snakemake runs a ``run:`` block in a worker thread, where none can), and it stays
  in the job's process group, so a terminal's Ctrl-C reaches it. It watches the
  processes above it up to Snakemake (:func:`lifeline_levels`): Snakemake alone where
  the block runs in a thread of Snakemake's own process (``force-use-threads``, the
  workflow profile's setting: a local job then costs no second Snakemake reading the
  workflow again, 2-3 s a job); else the job's process, its shell and Snakemake (a
  job Snakemake spawned, or a cluster job's).

``STUDY_FAIL_JOBS`` (a comma-separated list of modules, or ``all``) makes the named
entry points fail before they start: how the tests prove that every rule's failure
ends the run. Standard library only.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import tempfile
import traceback
from collections.abc import Sequence
from pathlib import Path

from .runtimes.base import LIFELINE_VAR, REPO_ROOT

#: where the entry point's process writes its failure message for the job
ERROR_FILE_VAR = "STUDY_JOB_ERROR_FILE"
FAIL_VAR = "STUDY_FAIL_JOBS"
#: processes above the entry point's that it watches in a job's own process (one Snakemake
#: spawned, ``--mode subprocess``, or a cluster job's, ``--mode remote``): the job's, its
#: shell, Snakemake
LIFELINE_LEVELS = 3


class JobFailed(RuntimeError):
    """A rule's entry point failed: Snakemake reports this message for the job."""


def run(target: str, *job, settings: dict | None = None) -> None:
    """For a rule's ``run:`` block. ``target`` is ``module`` or ``module:NAME``: the
    module's ``COMMAND`` (or ``NAME``, a subcommand's) gives the command line from
    ``job`` (Snakemake's input, output, params, wildcards and log) and ``settings``, and
    ``module.main`` runs with it in a process of its own. Raises :class:`JobFailed`
    with the entry point's message when it fails."""
    module, _, name = target.partition(":")
    try:
        command = getattr(importlib.import_module(module), name or "COMMAND")
        argv = command.argv(*job, settings=settings or {})
    except BaseException as exc:  # noqa: BLE001 - a SystemExit here would hang the job
        raise JobFailed(f"{module}: {describe(exc)}") from None
    run_entry(module, [str(a) for a in argv])


def run_entry(module: str, argv: Sequence[str]) -> None:
    """``main(argv)`` of ``module`` in a process of its own; :class:`JobFailed` (with the
    entry point's message) when it ends non-zero."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    env[LIFELINE_VAR] = str(lifeline_levels(sys.argv))
    with tempfile.TemporaryDirectory(prefix="study-job-") as tmp:
        error_file = Path(tmp) / "error.txt"
        env[ERROR_FILE_VAR] = str(error_file)
        try:
            code = subprocess.call([sys.executable, "-m", __name__, module, *argv], env=env)
        except BaseException as exc:  # noqa: BLE001 - never a SystemExit in the worker
            raise JobFailed(f"{module}: {describe(exc)}") from None
        message = error_file.read_text().strip() if error_file.exists() else ""
    if code:
        why = message or "no message; see the job's log"
        raise JobFailed(f"{module} failed (exit code {code}): {why}")


def lifeline_levels(argv: Sequence[str]) -> int:
    """How many processes above the entry point's it watches, from the command line of
    the process running the ``run:`` block (``argv``): in a job's own process (Snakemake
    gives it ``--mode``), that process, its shell and Snakemake; in Snakemake's main
    process (its thread), Snakemake alone: above it is whoever started the study (a
    terminal that may close under ``nohup``), not part of the job."""
    job_process = any(a == "--mode" or a.startswith("--mode=") for a in argv)
    return LIFELINE_LEVELS if job_process else 1


def describe(exc: BaseException) -> str:
    """One line for a failure: the exception's type and message (an exit's message)."""
    if isinstance(exc, SystemExit):
        code = exc.code
        if code is None or isinstance(code, int):
            return f"exited with code {code or 0}"
        return str(code)
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def exit_code(exc: SystemExit) -> int:
    if exc.code is None:
        return 0
    return exc.code if isinstance(exc.code, int) else 1


def injected(module: str) -> bool:
    names = {n.strip() for n in os.environ.get(FAIL_VAR, "").split(",") if n.strip()}
    return "all" in names or module in names or module.rsplit(".", 1)[-1] in names


class _Tail:
    """stderr, keeping its last non-empty line: the message of an entry point that
    printed it and exited with a bare code (``argparse``'s ``parser.error``)."""

    def __init__(self, stream):
        self.stream, self.line, self.partial = stream, "", ""

    def write(self, text: str) -> int:
        *done, self.partial = (self.partial + text).split("\n")
        self.line = next((d for d in reversed(done) if d.strip()), self.line)
        return self.stream.write(text)

    def last(self) -> str:
        return (self.partial if self.partial.strip() else self.line).strip()

    def __getattr__(self, name):
        return getattr(self.stream, name)


def main(argv: Sequence[str] | None = None) -> int:
    """The entry point's process: run ``<module>.main(argv)``; any failure is a non-zero
    exit, its message on stderr and in the job's error file."""
    args = list(sys.argv[1:] if argv is None else argv)
    tail = sys.stderr = _Tail(sys.stderr)
    if not args:
        print(f"usage: python -m {__name__} <module> [args...]", file=sys.stderr)
        return 2
    module, rest = args[0], args[1:]
    message, code = "", 0
    try:
        if injected(module):
            raise SystemExit(f"{module}: failure injected by {FAIL_VAR}")
        code = importlib.import_module(module).main(rest) or 0
        if code:
            message = tail.last() or f"{module} returned exit code {code}"
    except SystemExit as exc:
        code = exit_code(exc)
        if code and isinstance(exc.code, int):
            message = tail.last() or describe(exc)
        elif code:
            message = describe(exc)
            print(message, file=sys.stderr, flush=True)
    except BaseException as exc:  # noqa: BLE001 - every failure ends as a failed job
        traceback.print_exc()
        code, message = 1, describe(exc)
    if code and os.environ.get(ERROR_FILE_VAR):
        Path(os.environ[ERROR_FILE_VAR]).write_text(message + "\n")
    return code


if __name__ == "__main__":
    sys.exit(main())
