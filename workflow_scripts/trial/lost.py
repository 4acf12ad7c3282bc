"""A trial job lost whole on a cluster: its node failed, it was preempted, it hit its
own time limit or it was killed, and the trial's own process went with it, so nothing
wrote the record. Snakemake submits the job again (the profile's ``retries``); that
next attempt asks SLURM's accounting what became of the lost one and writes the record
from SLURM's own words, instead of running the trial again, and the study goes on.

How the next attempt knows: a trial in a SLURM job leaves a marker beside its record
(``<record>.attempt``, its job id) while it runs, and removes it when it has written the
record. A marker of another job left behind is a job lost whole: SIGKILLed with it (its
node failed: any end the accounting gives counts), or interrupted, which the marker then
says: SLURM signals a job before it kills it, at its time limit, at a preemption, and
for ``scancel`` (on the test cluster, ``--signal=KILL`` too reached the trial as
SIGTERM). An interrupted trial's record is written when its job ended by SLURM's own
hand (time limit, preemption, memory, node failure), or when the job is Snakemake's
retry (``attempt`` 2 and up: the earlier job failed while Snakemake ran, so something
else stopped it, a user's or an administrator's ``scancel``). On its first attempt, a
job that finds a cancelled trial's marker runs the trial again: Snakemake itself
cancels its jobs when it is stopped (Ctrl-C), and a resumed study runs what it
stopped, as an interrupted trial always has. Without accounting (``sacct`` cannot
answer) the attempt says so in its log and runs the trial again, as before. Standard
library only.
"""

from __future__ import annotations

import json
from pathlib import Path

from .. import sysinfo
from ..cluster import slurm
from ..util import read_json


def marker(out: Path) -> Path:
    return out.with_name(out.name + ".attempt")


def earlier_loss(
    out: Path, job_id: str, log: Path, run=None, attempt: int = 1
) -> tuple[str, str] | None:
    """(error type, SLURM's words) when an earlier job of this trial was lost whole; None
    when there was none, it is unknown (no accounting: said in ``log``), it has not
    ended, or Snakemake's own stop interrupted it (``attempt`` 1: a resumed study)."""
    try:
        left = read_json(marker(out), want=None)
        earlier, interrupted = left.get("slurm_job_id"), bool(left.get("interrupted"))
    except (OSError, ValueError, AttributeError):
        return None
    if not earlier or str(earlier) == str(job_id):
        return None
    try:
        job = slurm.job_end(earlier, **({"run": run} if run else {}))
    except slurm.NoAccounting as exc:
        with open(log, "a") as fh:
            print(f"[slurm] the trial's earlier job {earlier} ended without its record, and "
                  f"SLURM's accounting cannot say why ({exc}): running the trial again",
                  file=fh)  # fmt: skip
        return None
    loss = slurm.lost_job(job) if job else None
    if loss and interrupted and loss[0] not in SLURMS_OWN and attempt <= 1:
        return None  # a stop the trial lived through, maybe Snakemake's own: run it again
    return loss


#: the ends SLURM itself gives a job (an interrupted trial's record says so)
SLURMS_OWN = ("SlurmTimeLimit", "SlurmOutOfMemory", "SlurmPreempted", "SlurmNodeFailure")


def mark(out: Path, interrupted: bool = False) -> None:
    """In a SLURM job: note this job as the trial's running attempt (``interrupted``: it
    was stopped from outside, and lived to say so)."""
    job = sysinfo.slurm_job()
    if job:
        note = {"slurm_job_id": job["job_id"], **({"interrupted": True} if interrupted else {})}
        marker(out).write_text(json.dumps(note))


def unmark(out: Path) -> None:
    marker(out).unlink(missing_ok=True)
