"""The study on a real SLURM cluster: a one-node cluster on localhost (Debian's slurmctld,
slurmd and munge, set up by tests/slurm/cluster.sh and stopped afterwards, also when a
test fails), a part of the quick preset submitted through profiles/slurm by the executor
plugin: a single-process run in each of two environments, a text model, the
data-parallel layouts over both process groups and the collectives benchmark (the whole
preset runs locally in test_workflow and in images in test_containers)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import pandas as pd
import pytest
import yaml

from tests.conftest import ENVS_ROOT, REPO
from tests.test_workflow import REQUIRED_COLUMNS, copy_workflow
from workflow_scripts import study

CLUSTER = REPO / "tests" / "slurm" / "cluster.sh"
#: the whole run through SLURM must end within this (the plugin can wait forever when
#: it cannot read job states; the test then fails instead of hanging CI)
HARD_LIMIT_S = 2700  # the whole quick preset took ~30 min through SLURM on a 2-core Zen 1
#: what of the quick preset runs through SLURM: its experiments and sweeps by name
EXPERIMENTS = ("baseline", "ipex-optimize-fp32", "bert-tiny")
SWEEPS = ("ddp",)


def slurm_study(workdir: Path) -> dict:
    """The part of the quick preset this test submits (given to Snakemake as a config
    file, which wins over the preset's own experiments and sweeps)."""
    quick = study.read_config(workdir / "config.yaml")["presets"]["quick"]
    return {
        "experiments": [e for e in quick["experiments"] if e["id"] in EXPERIMENTS],
        "sweeps": [s for s in quick["sweeps"] if s.get("name") in SWEEPS],
    }


def cluster(action: str, state: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "STUDY_SLURM_DIR": str(state)}
    return subprocess.run(
        ["bash", str(CLUSTER), action], capture_output=True, text=True, timeout=600, env=env
    )


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    """A running one-node cluster; its state folder (logs, jobcomp.log)."""
    state = tmp_path_factory.mktemp("slurm")
    started = cluster("start", state)
    try:
        assert started.returncode == 0, started.stdout + started.stderr
        yield state
    finally:
        stopped = cluster("stop", state)
        print(stopped.stdout, stopped.stderr)


def jobcomp(state: Path) -> dict[int, dict]:
    """SLURM's own completion log: job id -> its fields (start, end, CPUs, state)."""
    jobs = {}
    for line in (state / "jobcomp.log").read_text().splitlines():
        fields = dict(re.findall(r"(\w+)=(\S*)", line))
        if "JobId" in fields:
            jobs[int(fields["JobId"])] = fields
    return jobs


def when(text: str) -> datetime:
    return datetime.fromisoformat(text)


def run_through_slurm(workdir: Path) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "snakemake", "--profile", "profiles/slurm"]
    # (noise reruns are the trial policy's, tested on their own: here they would only
    # add minutes on a shared machine)
    path = workdir / "slurm-study.yaml"
    path.write_text(yaml.safe_dump(slurm_study(workdir)))
    cmd += ["--configfile", str(path)]
    cmd += ["--config", "preset=quick", "runtime=local", f"envs_root={ENVS_ROOT}"]
    cmd += ["noise_retries=0"]
    proc = subprocess.Popen(
        cmd, cwd=workdir, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        out, _ = proc.communicate(timeout=HARD_LIMIT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # it ignores SIGTERM while it polls
        out, _ = proc.communicate()
        subprocess.run(["scancel", "--partition=study"], capture_output=True, timeout=60)
        raise AssertionError(f"not done after {HARD_LIMIT_S} s:\n{out[-5000:]}") from None
    return subprocess.CompletedProcess(cmd, proc.returncode, out, "")


@pytest.mark.slow
@pytest.mark.torch
def test_quick_preset_through_the_slurm_profile(slurm, tmp_path):
    wd = copy_workflow(tmp_path / "wf")
    shutil.copytree(REPO / "profiles", wd / "profiles")
    run = run_through_slurm(wd)
    assert run.returncode == 0, run.stdout[-8000:]

    # the jobs went through SLURM: the plugin's submissions, SLURM's own log of them
    submitted = {int(j) for j in re.findall(r"submitted with SLURM jobid (\d+)", run.stdout)}
    jobs = jobcomp(slurm)
    assert submitted and submitted <= set(jobs), (submitted, sorted(jobs))
    assert all(jobs[j]["JobState"] == "COMPLETED" for j in submitted)

    # the same study as a local run, in shape: every experiment, every column, ok
    summary = pd.read_csv(wd / "results/summary.csv")
    config = {**study.read_config(wd / "config.yaml"), "preset": "quick"}
    quick = study.load_study(config, cli=slurm_study(wd))
    assert set(summary["experiment"]) == set(quick.ids)
    assert {"baseline", "bert-tiny", "ipex-optimize-fp32"} <= set(quick.ids)
    assert set(REQUIRED_COLUMNS) <= set(summary.columns)
    failed = summary[summary["status"] != "ok"]
    assert failed.empty, failed[["experiment", "status", "error"]].to_string()
    assert (wd / "results/report/index.html").stat().st_size > 0

    # every record names its SLURM job and node; each trial ran in a job of its own...
    records = {
        p.parent.name: json.loads(p.read_text())
        for p in (wd / "results/records").glob("*/trial0.json")
    }
    trial_jobs = {e: int(r["provenance"]["slurm"]["job_id"]) for e, r in records.items()}
    assert len(set(trial_jobs.values())) == len(records)
    assert set(trial_jobs.values()) <= submitted
    assert set(summary["slurm_job_id"].astype(int)) == set(trial_jobs.values())
    assert summary["hostname"].notna().all() and summary["node_type"].notna().all()

    # ... alone: on the whole node (exclusive), overlapping no other job
    cpus = os.cpu_count()
    for experiment, job in trial_jobs.items():
        mine = jobs[job]
        assert int(mine["ProcCnt"]) == cpus, (experiment, mine)
        start, end = when(mine["StartTime"]), when(mine["EndTime"])
        for other, fields in jobs.items():
            if other != job and other in submitted:
                overlap = when(fields["StartTime"]) < end and start < when(fields["EndTime"])
                assert not overlap, (experiment, mine, fields)

    # the two-task experiments: one job of 2 tasks, whose ranks srun started
    two = [e for e, r in records.items() if r["spec"]["launcher"] == "torchrun"]
    two = [e for e in two if r_world(records[e]) == 2]
    assert two, sorted(records)
    for experiment in two:
        record = records[experiment]
        assert record["provenance"]["command"][0] == "srun", record["provenance"]["command"]
        assert len(record["checks"]["rank_hosts"]) == 2
        assert record["checks"]["world_size"] == 2
        assert len(set(record["checks"]["rank_cpus"])) == 2  # each rank its own CPUs
        log = (wd / f"logs/experiments/{experiment}/trial0.log").read_text()
        assert "[rank 1]" in log

    # the collectives benchmark runs like a trial: one task per rank, started by srun
    for variant in quick.settings["collectives"]["variants"]:
        bench = json.loads((wd / f"results/collectives/{variant}.json").read_text())
        assert bench["status"] == "ok" and bench["command"][0] == "srun", bench["command"]
        assert "--ntasks=2" in bench["command"], bench["command"]

    # rerunning submits only what changed: nothing
    again = run_through_slurm(wd)
    assert again.returncode == 0, again.stdout[-5000:]
    assert "submitted with SLURM jobid" not in again.stdout
    assert "Nothing to be done" in again.stdout


def r_world(record: dict) -> int:
    spec = record["spec"]
    return int(spec["ranks"]) * int(spec.get("nodes") or 1)
