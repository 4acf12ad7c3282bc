"""Snakemake's scheduler with the study's one-timer fix (workflow_scripts/snakemake_timers.py),
in real Snakemake runs of a small workflow whose jobs wait for one core."""

from __future__ import annotations

import subprocess
import sys

from tests.runs import timers_seen, waiting_jobs_workflow

JOBS = 30


def run_workflow(wd, *args: str, install: bool = True) -> list[int]:
    (wd / "Snakefile").write_text(waiting_jobs_workflow(JOBS, 0.02))
    cmd = [sys.executable, "-m", "snakemake", "--cores", "1", "--force-use-threads", "-q",
           *args, "--config", f"install={install}"]  # fmt: skip
    proc = subprocess.run(cmd, cwd=wd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return timers_seen(wd, JOBS)


def test_the_scheduler_keeps_one_pending_timer_however_many_jobs_have_run(tmp_path):
    timers = run_workflow(tmp_path)
    assert max(timers) <= 1, timers


def test_a_finished_workflow_exits_without_waiting_for_its_timer(tmp_path):
    """With an hour's timespan, Snakemake's own timers would keep the finished process
    alive for that hour (the subprocess's 120 s limit would end the test)."""
    timers = run_workflow(tmp_path, "--max-jobs-per-timespan", "100000/1h")
    assert len(timers) == JOBS and max(timers) <= 1


def test_install_replaces_the_one_method_and_says_so(monkeypatch):
    from snakemake.scheduling.job_scheduler import JobScheduler

    from workflow_scripts import snakemake_timers

    # restored after the test: this process's Snakemake is not the one under test
    monkeypatch.setattr(
        JobScheduler, "_schedule_reevalutation", JobScheduler._schedule_reevalutation
    )
    assert snakemake_timers.install() is True
    assert JobScheduler._schedule_reevalutation is snakemake_timers._schedule_reevaluation


def test_a_shorter_delay_is_not_held_back_by_a_longer_pending_one():
    """A wake-up asked for sooner than the pending one is due gets its own timer (the
    queue-input wait is 10 s, the rate limit's 1 s); a later one is left to the pending."""
    import threading
    import types

    from workflow_scripts import snakemake_timers

    scheduler = types.SimpleNamespace(_open_jobs=threading.Semaphore(0))
    snakemake_timers._schedule_reevaluation(scheduler, 30.0)
    snakemake_timers._schedule_reevaluation(scheduler, 0.05)
    assert scheduler._open_jobs.acquire(timeout=5.0)  # the short one fired
    assert scheduler._study_timer_due is None  # and freed the slot for the next pass
    snakemake_timers._schedule_reevaluation(scheduler, 0.05)
    snakemake_timers._schedule_reevaluation(scheduler, 0.05)  # due no sooner: none more
    assert scheduler._open_jobs.acquire(timeout=5.0)
    assert not scheduler._open_jobs.acquire(timeout=0.3)
