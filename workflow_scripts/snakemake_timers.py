"""One re-evaluation timer in Snakemake's scheduler, not one more per job event.

Snakemake's job scheduler (9.x, ``JobScheduler.schedule``) ends every scheduling pass
that leaves a ready job waiting with ``_schedule_reevalutation(timespan)``: a new
``threading.Timer`` that wakes the scheduler after the job rate limit's timespan (1 s
by default, ``--max-jobs-per-timespan 100/1s``). The pass that timer wakes ends the same
way, so each pass starts a chain that never ends while jobs wait, and every job start
and finish starts one more. In the default study (267 trials waiting for two cores)
the chains had grown to 197 timer threads after about 400 jobs: Snakemake's own
process then took a whole core for its job selection, beside the trials it was timing
(23 min of its CPU over a sitting of 1 h 52 min; 10 of the 13 trials of its last 22
minutes were disturbed and rerun). A longer timespan only slows the chains, and a
non-daemon timer of an hour keeps the finished process alive for that hour.

``install()`` replaces that one method: a scheduler starts no timer while a wake-up is
due no later than the new one would be (so one is pending, or two for a moment where a
shorter delay is asked for), and the timer is a daemon thread, so a finished workflow
exits at once. The scheduler still re-evaluates within the timespan after every pass
that leaves jobs waiting, which is what the timer is for.
Nothing is changed where the method is not there (another Snakemake), and installing
twice changes nothing.
"""

from __future__ import annotations

import threading
import time

_GUARD = threading.Lock()


def _schedule_reevaluation(self, delay) -> None:
    """Wake the scheduler after ``delay`` seconds, unless a wake-up is due by then."""
    due = time.monotonic() + float(delay)
    with _GUARD:
        pending = getattr(self, "_study_timer_due", None)
        if pending is not None and pending <= due:
            return
        self._study_timer_due = due
    timer = threading.Timer(delay, _fire, args=(self, due))
    timer.daemon = True
    timer.start()


def _fire(scheduler, due: float) -> None:
    with _GUARD:
        if getattr(scheduler, "_study_timer_due", None) == due:
            scheduler._study_timer_due = None  # the pass this wakes may start the next one
    scheduler._open_jobs.release()


def install() -> bool:
    """Coalesce the scheduler's re-evaluation timers; True when the method was replaced
    (now or by an earlier call), False where this Snakemake has no such method."""
    try:
        from snakemake.scheduling.job_scheduler import JobScheduler
    except ImportError:
        return False
    if not hasattr(JobScheduler, "_schedule_reevalutation"):  # sic: Snakemake's name
        return False
    JobScheduler._schedule_reevalutation = _schedule_reevaluation  # a second time: the same
    return True
