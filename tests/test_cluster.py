"""Cluster runs, without a cluster: what each job asks SLURM for, how srun's ranks find
each other, several-node experiments refused where there is one machine, and results
from several CPU models kept apart. (tests/test_cluster_slow.py: through ``snakemake``
and a real trial; tests/test_slurm.py runs them on a real cluster.)"""

from __future__ import annotations

import pandas as pd
import pytest

from workflow_scripts import launchers, study, sysinfo, trial
from workflow_scripts.cluster import sizing
from workflow_scripts.rank.distributed import ranks
from workflow_scripts.report.stats import experiment_stats, with_group_speedup
from workflow_scripts.summary.records import COLUMNS, noise_group_keys
from workflow_scripts.sysinfo import node_type

SETTINGS = {"noise_retries": 2, "collectives": {"ranks": 2}}


def test_a_single_process_trial_takes_a_whole_node(make_spec):
    res = sizing.experiment(make_spec(cpus="0-3"), SETTINGS)
    assert res["cpus_per_task"] == 4 and res["tasks"] == 1 and res["nodes"] == 1
    assert res["slurm_extra"] == "--exclusive" and res["mpi"] is None
    assert res["mem_mb"] >= sizing.MEMORY_FLOOR_MB and res["mem_mb"] % 1024 == 0
    # three attempts (2 noise reruns) of at most timeout_s each, plus the job's setup
    assert res["runtime"] >= 3 * 300 / 60 + sizing.SETUP_MIN


def test_a_multi_rank_trial_is_a_job_of_one_task_per_rank(make_spec):
    spec = make_spec(launcher="torchrun", ranks=2, threads=3, nodes=2, batch_size=8)
    res = sizing.experiment(spec, SETTINGS)
    assert (res["tasks"], res["nodes"], res["cpus_per_task"]) == (4, 2, 3)
    assert res["mpi"] == "srun"  # the plugin leaves starting the ranks to the trial
    assert res["slurm_extra"] == "--exclusive --ntasks-per-node=2"
    one = sizing.experiment(make_spec(launcher="torchrun", ranks=2, threads=3), SETTINGS)
    assert one["mem_mb"] <= res["mem_mb"]  # memory per node, for its 2 ranks


def test_srun_starts_the_ranks_and_each_takes_its_place_from_slurm(make_spec):
    spec = make_spec(launcher="torchrun", ranks=2, threads=1, nodes=2, batch_size=8)
    torchrun = launchers.get("torchrun")
    assert torchrun.ranks(spec) == 4
    cmd = torchrun.command(spec, "python", ["--out", "r{rank}.json"], starter="srun")
    assert cmd[0] == "srun" and "--ntasks=4" in cmd and "--nodes=2" in cmd
    assert "--ntasks-per-node=2" in cmd and "--cpus-per-task=1" in cmd
    env = torchrun.environment(spec, "srun")
    assert env["STUDY_RANKS_FROM"] == "slurm" and int(env["MASTER_PORT"]) > 0
    assert env["MASTER_ADDR"] != "127.0.0.1"  # rank 0 on this node, reached from others
    # what srun gives the task of global rank 3 (the second on node 1)
    task = {**env, "SLURM_PROCID": "3", "SLURM_NTASKS": "4", "SLURM_LOCALID": "1"}
    task.update(SLURM_NNODES="2", SLURM_NODEID="1", SLURM_NTASKS_PER_NODE="2")
    assert ranks.adopt_slurm(task)
    assert (task["RANK"], task["WORLD_SIZE"], task["LOCAL_RANK"]) == ("3", "4", "1")
    assert task["LOCAL_WORLD_SIZE"] == "2" and task["GROUP_RANK"] == "1"
    # a task that torchrun started, or no launcher at all: left alone
    assert not ranks.adopt_slurm({"SLURM_PROCID": "0", "SLURM_NTASKS": "1"})
    # locally, torchrun
    local = torchrun.command(spec, "python", ["--out", "r{rank}.json"])
    assert local[:4] == ["python", "-u", "-m", "torch.distributed.run"]


def test_srun_only_inside_a_slurm_job_and_only_for_several_ranks(make_spec, monkeypatch):
    torchrun = launchers.get("torchrun")
    two = make_spec(launcher="torchrun", ranks=2, threads=1)
    one = make_spec(launcher="torchrun", ranks=1, threads=2)
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    assert launchers.starter(torchrun, two, "local") == "local"
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    assert launchers.starter(torchrun, two, "local") == "srun"
    assert launchers.starter(torchrun, one, "local") == "local"  # its job is a 1-task step
    assert launchers.starter(torchrun, two, "podman") == "local"  # torchrun in the image


def test_several_nodes_need_a_slurm_job(make_spec, monkeypatch):
    spec = make_spec(launcher="torchrun", ranks=1, threads=1, nodes=2, batch_size=8)
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    assert "needs a SLURM job" in trial.cannot_start(spec, "local")
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    assert trial.cannot_start(spec, "local") is None
    assert "runtime: local" in trial.cannot_start(spec, "podman")
    assert trial.cannot_start(make_spec(), "local") is None


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"nodes": 2}, "nodes 2 needs launcher 'torchrun'"),
        (
            {"launcher": "torchrun", "nodes": 2, "ranks": 2, "batch_size": 6},
            "does not split evenly over nodes 2 x ranks 2 = 4 processes",
        ),
    ],
)
def test_nodes_errors(fields, message):
    config = {"groups": {"g": {"runs": [{"id": "x", **fields}]}}}
    with pytest.raises(study.StudyConfigError) as err:
        study.load_study(config)
    assert message in str(err.value)


def frame_of(rows: list[dict]) -> pd.DataFrame:
    base = {"status": "ok", "group": "ladder", "noisy": False, "test_accuracy": None}
    base.update(train_time_s=None, env="upstream", probe_size=1024, probe_threads=2)
    frame = pd.DataFrame([{**base, **r} for r in rows])
    for col in COLUMNS:  # every summary column, as summary_frame makes them
        if col not in frame:
            frame[col] = None
    return frame


def test_no_median_mixes_cpu_models():
    a = node_type({"cpu_model": "AMD EPYC 9R14", "logical_cpus": 2})
    b = node_type({"cpu_model": "Intel Xeon Platinum 8488C", "logical_cpus": 8})
    assert a == "AMD EPYC 9R14 (2 CPUs)" and a != b
    rows = [
        {"experiment": "baseline", "node_type": a, "samples_per_s": 10.0},
        {"experiment": "baseline", "node_type": b, "samples_per_s": 40.0},
        {"experiment": "bf16", "node_type": a, "samples_per_s": 20.0},
        {"experiment": "bf16", "node_type": b, "samples_per_s": 120.0},
    ]
    stats = with_group_speedup(experiment_stats(frame_of(rows)))
    by = stats.set_index("experiment")
    assert by.loc[f"baseline @ {a}", "sps_median"] == 10.0
    assert by.loc[f"baseline @ {b}", "sps_median"] == 40.0
    # each type's speedup over its own baseline
    assert by.loc[f"bf16 @ {a}", "group_speedup"] == pytest.approx(2.0)
    assert by.loc[f"bf16 @ {b}", "group_speedup"] == pytest.approx(3.0)
    # one node type: the experiments keep their ids
    same = experiment_stats(frame_of([r for r in rows if r["node_type"] == a]))
    assert list(same["experiment"]) == ["baseline", "bf16"]
    # noise probes are compared within a node type only
    keys = noise_group_keys(frame_of(rows))
    assert keys[0] != keys[1] and keys[0] == keys[2]


def test_the_slurm_job_a_record_names():

    env = {"SLURM_JOB_ID": "7", "SLURM_CLUSTER_NAME": "c", "SLURM_JOB_PARTITION": "cpu"}
    assert sysinfo.slurm_job(env) == {"job_id": "7", "cluster": "c", "partition": "cpu"}
    assert sysinfo.slurm_job({"SLURM_CLUSTER_NAME": "c"}) is None  # not in a job
