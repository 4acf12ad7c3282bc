"""How an attempt ended (ok, failed, crashed, timeout, oom, interrupted) and the record
it becomes: the harness's result merged over the ranks, or a failure with the tail of
the output."""

from __future__ import annotations

import re
from pathlib import Path

from .. import launchers, runtimes, sysinfo
from ..cluster import slurm
from ..plan import clock
from ..runtimes.base import REPO_ROOT
from ..runtimes.measured import Ran
from ..util import SCHEMA_VERSION, tail


def failure(spec: dict, trial: int, kind: str, message: str, log_tail: str | None = None) -> dict:
    """The record of a trial that produced no result."""
    error = {"type": kind, "message": message}
    if log_tail is not None:
        error["tail"] = log_tail
    return {
        "status": _FAILURE_STATUS.get(kind, "failed"),
        "error": error,
        "metrics": {},
        "schema_version": SCHEMA_VERSION,
        "experiment": spec["id"],
        "trial": trial,
        "spec": spec,
    }


_FAILURE_STATUS = {
    "Timeout": "timeout",
    "Crashed": "crashed",
    # a later trial of a configuration whose first trial's step was incorrect
    # (carry.incorrect_first): not run, the same verdict
    "IncorrectStep": "incorrect",
    "UnreadableResult": "crashed",
    "OutOfMemory": "oom",
    # SLURM ended the run's job step (slurm.ended_by_slurm)
    "SlurmOutOfMemory": "oom",
    "SlurmTimeLimit": "timeout",
    "SlurmPreempted": "preempted",
    "SlurmNodeFailure": "node_fail",
    # a trial the budget's clock left out (plan/clock.py): not a failure
    clock.KIND: clock.LEFT_OUT,
    # a job lost whole, as SLURM's accounting tells (trial.lost)
    "SlurmCancelled": "failed",
    "SlurmJobFailed": "failed",
}
_SLURM_KIND = {"oom": "SlurmOutOfMemory", "timeout": "SlurmTimeLimit",
               "preempted": "SlurmPreempted", "node_fail": "SlurmNodeFailure"}  # fmt: skip


def _output(log: Path, offset: int) -> str:
    """What the run wrote to its log (from ``offset``: this attempt's part)."""
    try:
        with open(log, "rb") as f:
            f.seek(offset)
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def ended_by_slurm(spec: dict, ran: Ran, log: Path, offset: int) -> dict | None:
    """The record of a run whose job step SLURM ended (srun's and slurmstepd's own
    words in its output: over its memory, its time limit, preempted, a failed node),
    or None."""
    if not ran.cmd or Path(ran.cmd[0]).name != "srun" or ran.clean:
        return None
    said = slurm.ended_by_slurm(_output(log, offset))
    if not said:
        return None
    status, words = said
    return failure(spec, 0, _SLURM_KIND[status], f"SLURM ended the job step: {words}", tail(log))


def outcome(spec: dict, launcher: launchers.Launcher, ran: Ran, log: Path, offset: int = 0) -> dict:
    """What the ranks left: the launcher's merge of their results, or why there is none.

    The kernel's out-of-memory killer (seen in the memory cgroup, or by the container
    engine) and an allocation that failed in the run give ``oom``; a run that wrote a
    result and then did not exit cleanly (a crash on exit) is ``crashed``, not ok."""
    how = ran.how
    by_slurm = ended_by_slurm(spec, ran, log, offset)
    if by_slurm:
        return by_slurm
    problem = ran.problem()
    if problem:
        kind, message = problem
        if kind == "Timeout":  # the limit is the spec's: name the field that set it
            message = f"killed after the spec's timeout_s={spec['timeout_s']} s"
        return failure(spec, 0, kind, message, tail(log))
    found = ran.results
    failed = [(r, res) for r, res in enumerate(found) if res and res.get("status") != "ok"]
    if failed and len(found) > 1:
        # a rank that failed ends the others (the launcher stops them): its error is why
        return _memory(launcher.merge([res if res else {"status": "stopped"} for res in found]))
    if any(res is None for res in found):
        lost = [r for r, res in enumerate(found) if res is None]
        who = f" (rank {', '.join(map(str, lost))})" if len(found) > 1 else ""
        return failure(
            spec, 0, "Crashed", f"the run {how} without writing a result{who}", tail(log)
        )
    try:
        record = _memory(launcher.merge(found))
    except ValueError as exc:
        return failure(spec, 0, "UnreadableResult", str(exc))
    if record.get("status") == "ok" and ran.finished.returncode != 0:
        record["status"] = "crashed"
        record["error"] = {
            "type": "CrashedAfterResult",
            "message": f"the run wrote its result, then {how}",
            "tail": tail(log),
        }
    return record


# an allocation that failed inside the run (torch's allocator, Python's MemoryError)
_MEMORY_ERROR = re.compile(
    r"MemoryError|(can't|cannot|unable to|failed to) allocate|not enough memory|out of memory",
    re.IGNORECASE,
)


def _memory(record: dict) -> dict:
    """A failed run whose error is a failed allocation ran out of memory: ``oom``."""
    error = record.get("error") or {}
    if record.get("status") == "failed" and _MEMORY_ERROR.search(
        f"{error.get('type', '')}: {error.get('message', '')}"
    ):
        record["status"] = "oom"
    return record


def assemble(
    record: dict,
    spec: dict,
    trial: int,
    env_info: dict,
    runtime: str,
    ran: Ran,
    started: str,
) -> dict:
    """Complete a record with what the trial policy knows: the spec, where and how it
    ran, and the process's lifetime as the trial policy saw it."""
    record.setdefault("metrics", {})
    record["schema_version"] = SCHEMA_VERSION
    record["experiment"] = spec["id"]
    record["trial"] = trial
    record["spec"] = spec
    prov = record.get("provenance") or sysinfo.collect()
    prov.setdefault("started_at", started)
    prov.setdefault("finished_at", sysinfo.now())
    prov.update(
        {
            "runtime": runtime,
            "env_name": env_info.get("name"),
            "env_prefix": env_info.get("prefix"),
            "env_lock_sha256": env_info.get("requirements_sha256"),
            **runtimes.image_provenance(env_info),
            "command": ran.cmd,
            "exit_code": ran.finished.returncode,
            "launched_at": ran.finished.launched_at,
            "ended_at": ran.finished.ended_at,
            "process_wall_s": ran.finished.wall_s,
            # forked from a warm interpreter (runtimes/warm.py), or a fresh process
            "started": "warm" if ran.finished.warm else "fresh",
        }
    )
    prov.setdefault("versions", env_info.get("versions", {}))
    prov["slurm"] = sysinfo.slurm_job()  # None outside a SLURM job
    if not prov.get("git_revision"):  # no git in the images: the host's checkout
        prov["git_revision"], prov["git_dirty"] = sysinfo.git_revision(REPO_ROOT)
    record["provenance"] = prov
    return record
