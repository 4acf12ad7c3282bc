"""The study on a real SLURM cluster of two compute nodes on this machine
(tests/slurm/cluster.sh: Debian's slurmctld, slurmd and munge; each node a network and
UTS namespace with its own hostname, address and CPU, on a bridge the script creates;
stopped afterwards, also when a test fails). Through profiles/slurm, the executor
plugin submits a part of the quick preset (two single-process runs of its ladder, a
text model), DDP on one node against two over both process groups,
the allreduce microbenchmark across the two nodes, and a trial that SLURM kills for
its memory. The nodes have 1 CPU each and this (submit) host 2: the study is planned
for the nodes, or sbatch would refuse every whole-node job. The cluster runs
MpiDefault=pmix and accounting (slurmdbd over its own MariaDB), as many sites do; two
trial jobs lost whole (one over its own time limit, one killed) become records, and the
ranks of a two-node ccl trial killed mid-run leave nothing in /dev/shm on either node. (The
whole quick preset runs locally in test_workflow and in images in test_containers_slow.)"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import pandas as pd
import pytest
import yaml

from tests.components import MPI, NODE_MEM_MB, NODES, cluster
from tests.conftest import ENVS_ROOT, REPO
from tests.runs import REQUIRED_COLUMNS, copy_workflow, pick_runs
from workflow_scripts import study
from workflow_scripts.plan import rounds

pytestmark = pytest.mark.slow  # a SLURM cluster on this machine

#: the whole run through SLURM must end within this (the plugin can wait forever when
#: it cannot read job states; the test then fails instead of hanging CI)
HARD_LIMIT_S = 2700
#: what of the quick preset runs through SLURM: its experiments by name
#: (a pair of the ladder, which the adaptive rounds compare; two environments: upstream's
#: and, for the DDP runs over ccl, oneCCL's; a third's calibration would hold up every
#: job that needs both nodes for its length)
EXPERIMENTS = ("baseline", "bf16", "bert-tiny")
#: DDP on one node against two, over both process groups (1 rank of 1 thread a node)
DDP = [
    {"id": f"ddp-{pg}-{n}n", "launcher": "torchrun", "ranks": 1, "threads": 1, "nodes": n,
     "dist_backend": pg}
    for pg in ("gloo", "ccl") for n in (1, 2)
]  # fmt: skip
#: a trial over its job's memory (the node's, 4 GB): resnet50 at 224 px, batch 64
OOM = {"id": "over-memory", "model": "resnet50", "image_size": 224,
       "batch_size": 64, "steps": 1, "warmup_steps": 1, "probe_size": 0}  # fmt: skip


def slurm_study(workdir: Path) -> dict:
    """What this test submits (given to Snakemake as a config file, which wins over the
    preset's own groups and collectives)."""
    quick = study.read_config(workdir / "config.yaml")["presets"]["quick"]
    return {
        "groups": {
            **pick_runs(quick, EXPERIMENTS),  # in their groups, with their shared fields
            "ddp-nodes": {"runs": DDP},
            "faults": {"runs": [OOM]},
        },
        "collectives": {
            **quick["collectives"],
            "nodes": 2,
            "ranks": 1,
            "variants": ["gloo", "ccl-tcp"],
        },  # fmt: skip
        # the ranks of a several-node trial talk over the nodes' own interface
        "cluster": {"network_interface": "eth0"},
        # the over-memory trial is over its node's memory on purpose
        "limits": {"over_memory": True},
    }


def node_cpus() -> int:
    """The CPUs SLURM says each node has (the nodes are alike)."""
    out = subprocess.run(["sinfo", "-h", "-N", "-p", "study", "-o", "%c"], capture_output=True,
                         text=True, timeout=60).stdout.split()  # fmt: skip
    assert len(out) == len(NODES) and len(set(out)) == 1, out
    return int(out[0])


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


def seen_late(output: str, jobs: dict[int, dict]) -> dict[int, float]:
    """Per SLURM job of a run (``output``: Snakemake's), the seconds from its end
    (SLURM's completion log, ``jobs``) to Snakemake's line that it finished."""
    said = re.findall(r"Job (\d+) has been submitted with SLURM jobid (\d+)", output)
    submitted = {int(a): int(b) for a, b in said}
    late = {}
    for stamp, job in re.findall(r"\[(\w{3} \w{3} +\d+ [\d:]+ \d{4})\]\nFinished jobid: (\d+)",
                                 output):  # fmt: skip
        slurm_job = submitted.get(int(job))
        if slurm_job in jobs:
            seen = datetime.strptime(stamp, "%a %b %d %H:%M:%S %Y")
            late[slurm_job] = (seen - when(jobs[slurm_job]["EndTime"])).total_seconds()
    return late


#: the most seconds between job-status checks these runs give (the profile's 10 suit a
#: real cluster; this one answers at once, and its jobs run one after another: the
#: two-node study took 151 and 158 s with 2, 179 s with 10)
STATUS_CHECKS_S = 2


def snakemake_cmd(workdir: Path, study_part: dict, *args: str) -> list[str]:
    cmd = [sys.executable, "-m", "snakemake", "--profile", "profiles/slurm", *args]
    cmd += ["--seconds-between-status-checks", str(STATUS_CHECKS_S)]
    # (noise reruns are the trial policy's, tested on their own: here they would only
    # add minutes on a shared machine)
    path = workdir / "slurm-study.yaml"
    path.write_text(yaml.safe_dump(study_part, sort_keys=False))
    cmd += ["--configfile", str(path)]
    cmd += ["--config", "preset=quick", "runtime=local", f"envs_root={ENVS_ROOT}"]
    return cmd + ["noise_retries=0"]


def run_through_slurm(
    workdir: Path, *config: str, part: dict | None = None
) -> subprocess.CompletedProcess:
    """The study part (``part``, else :func:`slurm_study`'s) through the profile
    (``config``: more --config values)."""
    cmd = snakemake_cmd(workdir, part or slurm_study(workdir)) + list(config)
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


@pytest.mark.torch
def test_the_study_on_two_nodes_through_the_slurm_profile(slurm, tmp_path):
    wd = copy_workflow(tmp_path / "wf")
    shutil.copytree(REPO / "profiles", wd / "profiles", dirs_exist_ok=True)
    run = run_through_slurm(wd)
    assert run.returncode == 0, run.stdout[-8000:]
    cpus = node_cpus()
    assert cpus < len(os.sched_getaffinity(0))  # the submit host has more than a node
    assert f"planned for partition 'study': 2 node(s) of {cpus} CPUs" in run.stdout

    # the jobs went through SLURM: the plugin's submissions, SLURM's own log of them
    submitted = {int(j) for j in re.findall(r"submitted with SLURM jobid (\d+)", run.stdout)}
    jobs = jobcomp(slurm)
    assert submitted and submitted <= set(jobs), (submitted, sorted(jobs))
    assert all(jobs[j]["JobState"] == "COMPLETED" for j in submitted)
    # each seen ended within the bound given on the wait between status checks (the
    # plugin's own backoff, unbounded, saw jobs of this run 16-20 s after they ended)
    late = seen_late(run.stdout, jobs)
    assert late and set(late) <= submitted, (late, submitted)
    assert max(late.values()) <= STATUS_CHECKS_S + 5, late
    # preparation (environments, report) ran here, not in a job
    assert "localrule build_env" in run.stdout and "localrule report" in run.stdout

    # the same study as a local run, in shape: every experiment, every column
    summary = pd.read_csv(wd / "results/summary.csv").set_index("experiment")
    config = {**study.read_config(wd / "config.yaml"), "preset": "quick"}
    planned = study.load_study(config, cli=slurm_study(wd))
    assert set(summary.index) == set(planned.ids)
    assert set(REQUIRED_COLUMNS) <= set(summary.reset_index().columns)
    assert (wd / "results/report/index.html").stat().st_size > 0

    # SLURM killed the trial over its memory: a record (oom, SLURM's words), and the
    # study went on
    assert summary.loc[OOM["id"], "status"] == "oom"
    oom = json.loads((wd / f"results/records/{OOM['id']}/trial0.json").read_text())
    assert oom["error"]["type"] == "SlurmOutOfMemory"
    assert "exceeded memory limit" in oom["error"]["message"]
    others = summary.drop(index=OOM["id"])
    failed = others[others["status"] != "ok"]
    assert failed.empty, failed[["status", "error"]].to_string()

    # every record names its SLURM job and node; each trial ran in a job of its own...
    records = {
        p.parent.name: json.loads(p.read_text())
        for p in (wd / "results/records").glob("*/trial0.json")
    }
    trial_jobs = {e: int(r["provenance"]["slurm"]["job_id"]) for e, r in records.items()}
    assert len(set(trial_jobs.values())) == len(records)
    assert set(trial_jobs.values()) <= submitted
    assert set(summary["slurm_job_id"].astype(int)) == set(trial_jobs.values())
    assert set(summary["hostname"]) <= set(NODES)
    assert summary["node_type"].notna().all()
    # blocked by node (cluster.block_by_node): trial 0 of the i-th experiment ran on node
    # i mod 2 of the partition's, as sinfo lists them (a several-node trial: on both)
    listed = subprocess.run(["sinfo", "-h", "-N", "-p", "study", "-o", "%N"], capture_output=True,
                            text=True, timeout=60).stdout.split()  # fmt: skip
    for i, experiment in enumerate(planned.ids):
        if planned.by_id[experiment]["nodes"] == 1:
            host = records[experiment]["provenance"]["hostname"]
            assert host == listed[i % len(listed)], (experiment, i, host, listed)

    # ... sized from the nodes (not this host), with the node's memory, on whole nodes
    # that no other job shared
    for experiment, job in trial_jobs.items():
        mine = jobs[job]
        assert int(mine["ProcCnt"]) == cpus * int(mine["NodeCnt"]), (experiment, mine)
        assert int(mine["NodeCnt"]) == records[experiment]["spec"]["nodes"], (experiment, mine)
        node_mem = f"mem={NODE_MEM_MB // 1024 * int(mine['NodeCnt'])}G"  # the whole nodes'
        assert node_mem in mine["Tres"], (experiment, mine)
        start, end = when(mine["StartTime"]), when(mine["EndTime"])
        for other, fields in jobs.items():
            if other != job and other in submitted and set_of(fields) & set_of(mine):
                overlap = when(fields["StartTime"]) < end and start < when(fields["EndTime"])
                assert not overlap, (experiment, mine, fields)

    # DDP across the two nodes: one rank on each, started by srun, on both process
    # groups; the report shows one node against two
    for pg in ("gloo", "ccl"):
        two = records[f"ddp-{pg}-2n"]
        assert two["provenance"]["command"][0] == "srun", two["provenance"]["command"]
        assert "--nodes=2" in two["provenance"]["command"]
        assert sorted(two["checks"]["rank_hosts"]) == list(NODES)
        assert two["checks"]["world_size"] == 2
        # each rank's group talked over the nodes' own interface (network_interface)
        addresses = two["checks"]["rank_addresses"]
        assert sorted(a["hostname"] for a in addresses) == list(NODES)
        assert all(a.get("GLOO_SOCKET_IFNAME") == "eth0" for a in addresses), addresses
        one = records[f"ddp-{pg}-1n"]
        assert len(one["checks"]["rank_hosts"]) == 1
    # on a pmix site, srun's tasks carry PMIx variables: the study's ranks are still no
    # MPI launch to oneCCL, and the record says how they were started
    config = records["ddp-ccl-2n"]["checks"]["ccl_config"]
    assert config["launch"]["STUDY_RANKS_FROM"] == "slurm", config
    assert config["launch"]["SLURM_MPI_TYPE"] == MPI and "PMIX_RANK" in config["launch"], config
    assert config["CCL_PROCESS_LAUNCHER"] == "none" and config["CCL_LOCAL_SIZE"] == "1"
    # and which libfabric providers oneCCL opened (its shm transport: shm for the ranks
    # of a node, and between the nodes cluster.fabric_provider's, tcp, on their
    # interface: left to itself, libfabric offered shm here too, which crosses no
    # machine's boundary on a real cluster)
    assert config["FI_PROVIDER"] == "tcp", config
    assert config["ofi"]["providers"] == ["shm", "tcp"], config["ofi"]
    assert config["ofi"]["nics"] == ["shm:shm", "tcp:eth0"], config["ofi"]
    html = (wd / "results/report/index.html").read_text()
    assert "<th>nodes</th>" in html and "ddp-gloo-2n" in html

    # the collectives benchmark across the two nodes, a rank on each
    for variant in ("gloo", "ccl-tcp"):
        bench = json.loads((wd / f"results/collectives/{variant}.json").read_text())
        assert bench["status"] == "ok", bench.get("error")
        assert bench["command"][0] == "srun" and "--nodes=2" in bench["command"]
        assert sorted(bench["rank_hosts"]) == list(NODES)
        assert all(r["nodes"] == 2 and r["ranks"] == 1 for r in bench["results"])
    # oneCCL's tcp transport across the nodes: libfabric's tcp provider on their interface
    tcp = json.loads((wd / "results/collectives/ccl-tcp.json").read_text())
    ofi = tcp["group"]["ccl_config"]["ofi"]
    assert ofi["providers"] == ["tcp"] and ofi["nics"] == ["tcp:eth0"], ofi
    assert "1 rank on each of 2 nodes" in html

    # rerunning submits only what changed: nothing
    again = run_through_slurm(wd)
    assert again.returncode == 0, again.stdout[-5000:]
    assert "submitted with SLURM jobid" not in again.stdout
    assert "Nothing to be done" in again.stdout

    # the adaptive rounds through the profile: three of its experiments again, now with
    # trials 2 and max_trials 3 (their first trials stand: their specs are the same).
    # Each gets its second trial (the minimum), then round 1's report (a checkpoint, run
    # here) decides, and only the experiments its undecided comparisons name run a
    # third (one whose first trial stopped far from its baseline runs no second); every
    # trial a SLURM job of its own; then nothing is left to do
    keep = ("baseline", "bf16", "ddp-ccl-2n")
    part = slurm_study(wd)
    part["groups"] = pick_runs(part, keep)
    adaptive = run_through_slurm(wd, "trials=2", "max_trials=3", part=part)
    assert adaptive.returncode == 0, adaptive.stdout[-8000:]
    assert "localcheckpoint round_report" in adaptive.stdout
    stopped = rounds.stopped_far(wd / "results/records", keep)
    second = [e for e in keep if e not in stopped]
    for experiment in keep:
        has = (wd / f"results/records/{experiment}/trial1.json").exists()
        assert has == (experiment in second), experiment
    settings = {**study.load_study(part).settings, "trials": 2, "max_trials": 3}
    going_on = rounds.going_on(wd / "results/rounds/1/comparisons.csv", second, settings, 1)
    third = {p.parent.name for p in (wd / "results/records").glob("*/trial2.json")}
    assert third == set(going_on), (third, going_on)
    jobs = jobcomp(slurm)
    for path in (wd / "results/records").glob("*/trial[12].json"):
        job = int(json.loads(path.read_text())["provenance"]["slurm"]["job_id"])
        assert job not in trial_jobs.values() and jobs[job]["JobState"] == "COMPLETED", path
    summary = pd.read_csv(wd / "results/summary.csv")
    assert len(summary) == len(keep) + len(second) + len(going_on)
    again = run_through_slurm(wd, "trials=2", "max_trials=3", part=part)
    assert again.returncode == 0, again.stdout[-5000:]
    assert "submitted with SLURM jobid" not in again.stdout
    assert "Nothing to be done" in again.stdout


def test_a_node_held_for_a_waiting_job_is_up(slurm, tmp_path):
    """A node that the backfill scheduler holds empty for a waiting two-node job (sinfo:
    planned, a mark that stays until its next pass, also after that job has run) is up,
    as a node in use is: cluster.sh status says so."""
    submit = ["sbatch", "--parsable", "-p", "study", "-t", "1", "-o", "/dev/null"]
    jobs = []
    try:
        for args in (["-w", NODES[0], "--wrap", "sleep 60"], ["-N", "2", "--wrap", "true"]):
            sub = subprocess.run(submit + args, cwd=tmp_path, capture_output=True, text=True,
                                 timeout=60)  # fmt: skip
            assert sub.returncode == 0, sub.stderr
            jobs.append(sub.stdout.strip().split(";")[0])
        states = {}
        deadline = time.monotonic() + 60
        while states.get(NODES[1]) != "planned" and time.monotonic() < deadline:
            time.sleep(0.5)
            out = subprocess.run(["sinfo", "-h", "-N", "-p", "study", "-o", "%N %T"],
                                 capture_output=True, text=True, timeout=60).stdout  # fmt: skip
            states = dict(line.split() for line in out.splitlines() if line.strip())
        assert states.get(NODES[1]) == "planned", states
        status = cluster("status", slurm)
        assert status.returncode == 0, status.stderr
    finally:
        subprocess.run(["scancel", *jobs], capture_output=True, timeout=60)


def test_a_study_is_planned_for_the_nodes_not_the_submit_host(slurm, tmp_path):
    """The quick preset's DDP sweep (layouts: all) on nodes of 1 CPU, planned from a
    submit host of 2 (and of 1, its planning process restricted): every job asks for
    what a node has. A study that cannot fit the nodes is refused before any job, with
    the partition and what its nodes have."""
    # another session's stop (another state folder) leaves this cluster alone
    other = cluster("stop", tmp_path / "another-session")
    assert other.returncode == 0 and "nothing started from" in other.stdout
    status = cluster("status", slurm)
    assert status.returncode == 0, status.stderr
    wd = copy_workflow(tmp_path / "wf")
    shutil.copytree(REPO / "profiles", wd / "profiles", dirs_exist_ok=True)
    quick = study.read_config(wd / "config.yaml")["presets"]["quick"]
    ddp = {"groups": pick_runs(quick, ("baseline", "ddp")), "collectives": {"variants": []}}
    cpus = node_cpus()
    for restrict in ([], ["taskset", "-c", "0"]):
        cmd = restrict + snakemake_cmd(wd, ddp, "-n", "--forceall")
        dry = subprocess.run(cmd, cwd=wd, capture_output=True, text=True, timeout=600)
        assert dry.returncode == 0, dry.stdout[-5000:] + dry.stderr[-3000:]
        jobs = re.split(r"^\[\w{3} \w{3} .*\]$", dry.stdout, flags=re.MULTILINE)
        trials = [b for b in jobs if "rule run_experiment:" in b]
        asked = [int(re.search(r"cpus_per_task=(\d+)", b).group(1)) for b in trials]
        assert trials and max(asked) <= cpus, (restrict, asked)
        # whole-node jobs ask for the node's memory
        mem = {int(re.search(r"mem_mb=(\d+)", b).group(1)) for b in trials}
        assert mem == {NODE_MEM_MB}, (restrict, mem)
    # the builds as cluster jobs, where a site keeps heavy work off its login nodes
    # (cluster.build_on: compute): each fits a node (a dry run does not say where a job
    # runs; the real runs do: test_jobs_lost_whole_become_records)
    part = {**ddp, "cluster": {"build_on": "compute"}}
    dry = subprocess.run(snakemake_cmd(wd, part, "-n", "--forceall"), cwd=wd,
                         capture_output=True, text=True, timeout=600)  # fmt: skip
    assert dry.returncode == 0, dry.stdout[-3000:] + dry.stderr[-3000:]
    builds = [b for b in re.split(r"^\[\w{3} \w{3} .*\]$", dry.stdout, flags=re.MULTILINE)
              if "rule build_env:" in b]  # fmt: skip
    asked = [int(re.search(r"cpus_per_task=(\d+)", b).group(1)) for b in builds]
    assert builds and max(asked) <= cpus, asked
    assert max(int(re.search(r"mem_mb=(\d+)", b).group(1)) for b in builds) <= NODE_MEM_MB
    # more threads than a node has: refused, naming the partition and its nodes
    big = {"groups": {"wide": {"runs": [{"id": "wide", "threads": cpus + 1}]}},
           "collectives": {"variants": []}}  # fmt: skip
    refused = subprocess.run(snakemake_cmd(wd, big, "-n"), cwd=wd, capture_output=True,
                             text=True, timeout=600)  # fmt: skip
    out = refused.stdout + refused.stderr
    assert refused.returncode != 0
    assert "experiment wide.threads" in out
    assert f"partition 'study': 2 node(s) of {cpus} CPUs and {NODE_MEM_MB} MB" in out
    assert "submitted with SLURM jobid" not in out


#: in each task srun starts: what the study's rank does first, and what it then records
RANK_START = """
import json, os
from workflow_scripts.rank.distributed import ccl, ranks
assert ranks.adopt_slurm()
ccl.launcher_environment(os.environ)
config = ccl.effective_config()
print(json.dumps({**{k: config.get(k) for k in ("CCL_PROCESS_LAUNCHER", "CCL_LOCAL_RANK",
    "CCL_LOCAL_SIZE")}, "launch": config["launch"], "rank": os.environ["RANK"],
    "world": os.environ["WORLD_SIZE"], "host": os.uname().nodename}))
"""


@pytest.mark.parametrize("mpi", ["pmi2", "pmix"])
def test_ranks_under_each_mpi_plugin_sites_run(slurm, mpi):
    """srun with a site's MPI plugin (what MpiDefault or --mpi sets) gives its tasks that
    plugin's rank variables; the study's ranks, one on each node, still take their places
    from SLURM, tell oneCCL it has no MPI launcher, and record the plugin. (pmix needs
    libpmix-dev, which Debian's mpi_pmix opens, and a TmpFS of each node's own: the
    cluster script sees to both.)"""
    env = {**os.environ, "STUDY_RANKS_FROM": "slurm", "PYTHONPATH": str(REPO)}
    cmd = ["srun", f"--mpi={mpi}", "--partition=study", "--nodes=2", "--ntasks=2",
           "--ntasks-per-node=1", sys.executable, "-c", RANK_START]  # fmt: skip
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    tasks = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert sorted(t["rank"] for t in tasks) == ["0", "1"], proc.stdout
    assert sorted(t["host"] for t in tasks) == list(NODES)
    for task in tasks:
        assert task["world"] == "2" and task["CCL_PROCESS_LAUNCHER"] == "none", task
        assert task["CCL_LOCAL_RANK"] == "0" and task["CCL_LOCAL_SIZE"] == "1", task
        launch = task["launch"]
        assert launch["SLURM_MPI_TYPE"] == mpi, launch
        # the plugin's own rank variable, which the study did not take for an MPI launch
        assert ("PMIX_RANK" if mpi == "pmix" else "PMI_RANK") in launch, launch


#: two trials that would run for hours, in jobs of a 1-minute time limit
#: (and the environment build as a cluster job of its own: cluster.build_on: compute)
#: (every step asked for: no stop once the step time is known)
LOST = {"groups": {"faults": {"runs": [
            {"id": f"lost-{how}", "steps": 1_000_000, "probe_size": 0, "timeout_s": 3000,
             "step_precision": None, "far_stop": None} for how in ("time", "killed")]}},
        "collectives": {"variants": []},
        "cluster": {"build_on": "compute"}}  # fmt: skip


@pytest.mark.torch
def test_jobs_lost_whole_become_records(slurm, tmp_path):
    """A trial job that hits its own time limit, and one killed from outside (scancel
    --signal=KILL, a stand-in for a failed node), take the trial's process with them:
    the profile's retry asks SLURM's accounting what became of each and writes its
    record, and the study completes."""
    wd = copy_workflow(tmp_path / "wf")
    shutil.copytree(REPO / "profiles", wd / "profiles", dirs_exist_ok=True)
    cmd = snakemake_cmd(wd, LOST, "--set-resources", "run_experiment:runtime=1")
    proc = subprocess.Popen(cmd, cwd=wd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)  # fmt: skip
    killed = None
    try:
        log = wd / "logs/experiments/lost-killed/trial0.log"
        deadline = time.monotonic() + 600
        while killed is None:
            assert proc.poll() is None, proc.stdout.read()[-5000:]
            assert time.monotonic() < deadline, "the trial never got going"
            if log.exists() and "step 3/" in log.read_text(errors="replace"):
                queue = subprocess.run(["squeue", "-h", "-o", "%i|%k"], capture_output=True,
                                       text=True, timeout=60).stdout  # fmt: skip
                jobs = [line.split("|")[0] for line in queue.splitlines() if "lost-killed" in line]
                if jobs:
                    killed = jobs[0]
                    subprocess.run(["scancel", "--signal=KILL", killed], check=True, timeout=60)
            time.sleep(0.5)
        out, _ = proc.communicate(timeout=HARD_LIMIT_S)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            subprocess.run(["scancel", "--partition=study"], capture_output=True, timeout=60)
    assert proc.returncode == 0, out[-8000:]
    over = json.loads((wd / "results/records/lost-time/trial0.json").read_text())
    assert over["status"] == "timeout" and over["error"]["type"] == "SlurmTimeLimit", over["error"]
    assert (
        "TIMEOUT" in over["error"]["message"] and "time limit 00:01:00" in over["error"]["message"]
    )
    gone = json.loads((wd / "results/records/lost-killed/trial0.json").read_text())
    # (killed in its steps: CANCELLED, or FAILED where the batch script outlives them)
    assert gone["error"]["type"] in ("SlurmCancelled", "SlurmJobFailed"), gone["error"]
    assert gone["status"] == "failed" and f"job {killed} " in gone["error"]["message"]
    for record in (over, gone):  # written by the next attempt, in a job of its own
        assert record["error"]["message"].startswith("the trial's earlier job was lost whole")
        own = record["provenance"]["slurm"]["job_id"]  # the retry's job: not the lost one
        assert not re.search(rf"\bjob {own}\b", record["error"]["message"]), own
    assert not list(wd.glob("results/records/*/*.attempt"))
    # the environment was built in a job on a node, not on this (submit) host
    assert re.search(r"^rule build_env:", out, flags=re.MULTILINE), out[-5000:]
    assert "localrule build_env" not in out
    assert list(wd.glob(".snakemake/slurm_logs/rule_build_env/*/*.log"))
    assert (wd / "results/summary.csv").exists()  # the study went on to its report
    # the accounting lists the study's jobs: both lost ones, and their retries
    listed = subprocess.run(["sacct", "-X", "-n", "-P", "--format=JobID,State", "-S", "now-1hour"],
                            capture_output=True, text=True, timeout=60).stdout  # fmt: skip
    states = dict(line.split("|", 1) for line in listed.splitlines() if "|" in line)
    assert states.get(killed, "").startswith(("CANCELLED", "FAILED"))
    assert "TIMEOUT" in states.values() and "COMPLETED" in states.values()


@pytest.mark.torch
def test_ranks_killed_on_two_nodes_leave_nothing_in_dev_shm(slurm, oneccl_env, tmp_path):
    """oneCCL's shm transport leaves its segments in each node's /dev/shm after a kill:
    the ranks of a two-node ccl trial (its batch script on the first node, as the
    profile's jobs run) are SIGKILLed mid-run, and the run removes every one of their
    segments, each node its own (the second node's by a cleanup step there: the nodes
    here share this machine's /dev/shm and /tmp, but not their host names, under which
    each node's ranks register), and says so in its log."""
    from tests.conftest import spec_of
    from tests.trials import rank_pids
    from workflow_scripts import shm

    spec = spec_of(id=f"shm-2n-{os.getpid()}", launcher="torchrun", ranks=1, threads=1,
                   nodes=2, dist_backend="ccl", steps=100_000, timeout_s=300)  # fmt: skip
    assert spec["ccl_transport"] == "shm"
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    (tmp_path / "env.json").write_text(json.dumps(oneccl_env))
    log = tmp_path / "trial.log"
    trial = (
        "import json, pathlib; from workflow_scripts.trial import policy; "
        f"p = pathlib.Path({str(tmp_path)!r}); "
        "policy.run(policy.Trial(json.loads((p / 'spec.json').read_text()), "
        "json.loads((p / 'env.json').read_text()), p / 'rec.json', p / 'trial.log'))"
    )
    script = tmp_path / "job.sh"
    script.write_text(f"#!/bin/bash\nexport STUDY_NETWORK_INTERFACE=eth0\ncd {REPO}\n"
                      f"exec {sys.executable} -c {shlex.quote(trial)}\n")  # fmt: skip
    job = subprocess.Popen(
        ["sbatch", "--wait", "--partition=study", "--nodes=2", f"--output={tmp_path}/job.out",
         str(script)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 300
        while not (log.exists() and "step 5/" in log.read_text(errors="replace")):
            assert job.poll() is None and time.monotonic() < deadline, job.communicate()[0]
            time.sleep(0.5)
        pids = rank_pids(spec["id"])
        assert len(pids) == 2, pids
        made = shm.segments(pids)
        assert made, "the ranks made no shm segment: nothing to test"
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        out, _ = job.communicate(timeout=300)
    finally:
        if job.poll() is None:
            subprocess.run(["scancel", "--partition=study"], capture_output=True, timeout=60)
            job.kill()
    assert shm.segments(pids) == [], "the killed ranks' segments are still there"
    record = json.loads((tmp_path / "rec.json").read_text())
    assert record["status"] != "ok"
    text = log.read_text()
    assert "shared-memory segment(s) the run's processes left" in text, text[-3000:]
    # each node removed its own rank's: the second node's are named with it
    assert "on study-node2" in text and "the cleanup step" not in text, text[-3000:]
    assert all(p.name in text for p in made), (made, text[-3000:])


def set_of(fields: dict) -> set[str]:
    """The nodes of a job in SLURM's completion log (study-node[1-2] -> both)."""
    text = fields["NodeList"]
    m = re.fullmatch(r"(.*)\[(\d+)-(\d+)\]", text)
    if m:
        return {f"{m.group(1)}{i}" for i in range(int(m.group(2)), int(m.group(3)) + 1)}
    return set(text.split(","))
