"""How an entry point's failure becomes its job's message (workflow_scripts/jobs.py). (Every
rule's failure through the real ``snakemake``: tests/test_rule_failures.py.)"""

from __future__ import annotations

import pytest

from workflow_scripts import jobs


def test_an_entry_points_own_message_reaches_the_job(tmp_path):
    """argparse prints its usage and then its error, and exits with a bare code: the
    job's message is the error line, whole; an exception gives its type and text."""
    args = ["--summary", str(tmp_path / "s.csv"), "--html", str(tmp_path / "i.html"),
            "--plots-dir", str(tmp_path), "--prices-json", "["]  # fmt: skip
    with pytest.raises(jobs.JobFailed) as failed:
        jobs.run_entry("workflow_scripts.report", args)
    assert str(failed.value) == (
        "workflow_scripts.report failed (exit code 2): python -m workflow_scripts.report: "
        "error: --prices-json is not valid JSON: Expecting value: line 1 column 2 (char 1)"
    )
    with pytest.raises(jobs.JobFailed) as failed:
        jobs.run_entry("workflow_scripts.no_such_module", [])
    assert "ModuleNotFoundError: No module named 'workflow_scripts.no_such_module'" in str(
        failed.value
    )


def test_the_entry_point_watches_snakemake_and_no_process_above_it():
    """Where Snakemake runs the job's block in its own process (the workflow profile's
    force-use-threads), the entry point watches that process alone: above it is whoever
    started the study. In a process of the job's own (spawned by Snakemake, or a cluster
    job's), that process, its shell and Snakemake."""
    assert jobs.lifeline_levels(["snakemake", "--cores", "all"]) == 1
    spawned = ["snakemake", "--target-jobs", "a:i=0", "--mode", "subprocess"]
    assert jobs.lifeline_levels(spawned) == jobs.LIFELINE_LEVELS == 3
    assert jobs.lifeline_levels(["snakemake", "--mode=remote"]) == 3
