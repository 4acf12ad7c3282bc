"""Planning for a cluster's nodes (sinfo's answer, the ``cluster`` setting), SLURM's
words when it ends a job step, and what the measured jobs ask for. (The real cluster
runs in tests/test_slurm.py.)"""

from __future__ import annotations

import socket
import subprocess

import pytest

from workflow_scripts.cluster import sizing, slurm
from workflow_scripts.collectives import rank_counts, variant_spec
from workflow_scripts.launchers.torchrun import LAUNCHER as TORCHRUN
from workflow_scripts.launchers.torchrun import ephemeral_ports, free_port, interface_address
from workflow_scripts.spec.settings import SETTING_DEFAULTS
from workflow_scripts.study import StudyConfigError, load_study
from workflow_scripts.workloads import estimated_memory_mb

SINFO = """\
cpu-[1-2]|cpu*|64|256000|icelake,avx512|idle
cpu-3|cpu*|64|256000|icelake,avx512|mixed
cpu-4|cpu*|64|256000|icelake,avx512|down*
big-1|big|128|512000|sapphire,amx|idle
big-2|big|96|384000|genoa|idle
odd line without fields
"""


def settings(**cluster_fields) -> dict:
    return {"cluster": {**SETTING_DEFAULTS["cluster"], **cluster_fields}}


def fake_sinfo(text: str = SINFO, code: int = 0):
    def run(cmd, **kwargs):
        assert cmd[0] == "sinfo"
        return subprocess.CompletedProcess(cmd, code, text, "sinfo: error: no controller")

    return run


def test_the_default_partition_and_its_usable_nodes():
    node = slurm.planned_node(settings(), run=fake_sinfo())
    assert (node.partition, node.cpus, node.mem_mb) == ("cpu", 64, 256000)
    assert node.nodes == ("cpu-[1-2]", "cpu-3")  # a down node does not count
    assert node.describe() == "partition 'cpu': 2 node(s) of 64 CPUs and 256000 MB (sinfo)"


def test_a_partition_of_several_node_types_is_refused_unless_a_feature_picks_one():
    with pytest.raises(slurm.ClusterError, match=r"partition 'big' has nodes of 2 types"):
        slurm.planned_node(settings(partition="big"), run=fake_sinfo())
    node = slurm.planned_node(settings(partition="big", constraint="amx"), run=fake_sinfo())
    assert (node.cpus, node.mem_mb, node.nodes) == (128, 512000, ("big-1",))


def test_what_the_setting_says_wins_over_sinfo():
    both = slurm.planned_node(settings(node_cpus=8, node_mem_mb=16000), run=None)
    assert (both.cpus, both.mem_mb, both.source) == (8, 16000, "config")
    one = slurm.planned_node(settings(node_cpus=32), run=fake_sinfo())
    assert (one.cpus, one.mem_mb, one.source) == (32, 256000, "sinfo and config")


def test_a_cluster_that_cannot_answer_or_has_no_such_partition_is_an_error():
    with pytest.raises(slurm.ClusterError, match="no controller"):
        slurm.planned_node(settings(), run=fake_sinfo(code=1))
    with pytest.raises(slurm.ClusterError, match=r"'gpu' is not a partition.*big, cpu"):
        slurm.planned_node(settings(partition="gpu"), run=fake_sinfo())
    with pytest.raises(slurm.ClusterError, match="no usable node with features 'arm'"):
        slurm.planned_node(settings(constraint="arm"), run=fake_sinfo())
    with pytest.raises(slurm.ClusterError, match="no default partition"):
        slurm.planned_node(settings(), run=fake_sinfo(SINFO.replace("cpu*", "cpu")))


@pytest.mark.parametrize(
    "output, status",
    [
        (
            "slurmstepd-n1: error: StepId=5.1 exceeded memory limit (43 > 42), being killed\n"
            "srun: error: n1: task 0: Killed\n",
            "oom",
        ),  # fmt: skip
        ("slurmstepd: error: Detected 1 oom-kill event(s) in StepId=7.0.\n", "oom"),
        (
            "slurmstepd: error: *** STEP 9.0 ON n1 CANCELLED AT 2026-01-01 DUE TO TIME LIMIT ***",
            "timeout",
        ),  # fmt: skip
        (
            "slurmstepd: error: *** JOB 9 ON n1 CANCELLED AT 2026-01-01 DUE TO PREEMPTION ***",
            "preempted",
        ),  # fmt: skip
        (
            "srun: error: Node failure on n2\nslurmstepd: error: *** JOB 3 CANCELLED AT x "
            "DUE TO NODE FAILURE, SEE SLURMCTLD LOG FOR DETAILS ***",
            "node_fail",
        ),  # fmt: skip
        # the formats of other SLURM versions and settings, as sites print them
        ("srun: error: node7: task 0: Out Of Memory\n", "oom"),  # 21.08+
        (
            "[2026-11-25T10:00:01.123] error: Detected 1 oom_kill event in StepId=31.0. "
            "Some of the step tasks have been OOM Killed.\n",
            "oom",
        ),  # slurmstepd with a timestamp prefix, 23.02+ wording  # fmt: skip
        (
            "slurmstepd: error: Detected 1 oom-kill event(s) in step 31.0 cgroup. Some of "
            "your processes may have been killed by the cgroup out-of-memory handler.\n",
            "oom",
        ),  # 19.05-20.11  # fmt: skip
        ("slurmstepd: error: Job 31 exceeded memory limit (5000 > 4096), being killed\n", "oom"),
        (
            "0: slurmstepd: error: *** STEP 12.0 ON n1 CANCELLED AT 2026-11-25T10:00:00 DUE TO "
            "TIME LIMIT ***\n",
            "timeout",
        ),  # srun --label  # fmt: skip
        (
            "[2026-11-25T10:00:00.000] *** JOB 12 ON n1 CANCELLED AT 2026-11-25T10:00:00 DUE "
            "TO TIME LIMIT ***\n",
            "timeout",
        ),  # fmt: skip
        (
            "[2026-11-25T10:00:00.001] srun: error: Node failure on n3\n"
            "srun: Job step aborted: Waiting up to 32 seconds for job step to finish.\n",
            "node_fail",
        ),  # srun --verbose  # fmt: skip
        (
            "slurmstepd: error: *** STEP 8.0 ON n1 CANCELLED AT 2026-11-25T10:00:00 DUE TO "
            "PREEMPTION ***\n",
            "preempted",
        ),  # fmt: skip
    ],
)
def test_slurms_own_words_say_why_it_ended_a_step(output, status):
    said = slurm.ended_by_slurm("[rank 0] step 1/3: 0.1 s loss 2.3\n" + output)
    assert said is not None and said[0] == status
    assert said[1] and "step 1/3" not in said[1]  # SLURM's lines only


def test_a_runs_own_words_are_not_slurms():
    # a trial's own out-of-memory message, or a training log: not SLURM ending the step
    assert slurm.ended_by_slurm("RuntimeError: out of memory\nstep 2/3 oom-kill") is None
    # a timestamped line of another program's: only slurmstepd's own wording counts
    assert slurm.ended_by_slurm("[2026-11-25T10:00:00.000] error: out of memory") is None
    assert slurm.ended_by_slurm("[12:00:01] task 0: Out Of Memory in my loader") is None
    assert slurm.ended_by_slurm("srun: cluster configuration lacks support for cpu binding") is None


def test_whole_node_jobs_ask_for_the_nodes_memory_and_go_where_the_setting_says(
    make_spec, monkeypatch
):
    spec = make_spec()
    study_settings = {"noise_retries": 0, **settings(partition="cpu", constraint="icelake")}
    monkeypatch.delenv(slurm.NODE_MEM_VAR, raising=False)
    assert sizing.experiment(spec, study_settings)["mem_mb"] == sizing.memory_mb(
        estimated_memory_mb(spec)
    )
    monkeypatch.setenv(slurm.NODE_MEM_VAR, "256000")
    res = sizing.experiment(spec, study_settings)
    assert res["mem_mb"] == 256000
    assert res["slurm_partition"] == "cpu" and res["constraint"] == "icelake"
    assert "slurm_account" not in res  # unset: a profile's default resource applies
    assert sizing.calibration(study_settings)["mem_mb"] == 256000


def test_the_collectives_across_nodes():
    assert rank_counts("all", 4, nodes=2) == [1, 2, 4]
    assert rank_counts("all", 1, nodes=2) == [1]
    assert rank_counts("all", 1) == [2]  # one node: at least 2 ranks
    spec = variant_spec("gloo", 1, 60, nodes=2)
    assert TORCHRUN.ranks(spec) == 2
    res = sizing.collectives({**settings(), "collectives": {"ranks": 1, "nodes": 2}})
    assert (res["nodes"], res["tasks"]) == (2, 2)
    assert res["slurm_extra"] == "--exclusive --ntasks-per-node=1"
    base = {
        "groups": {"g": {"runs": [{"id": "x"}]}},
        "collectives": {"variants": ["gloo"], "ranks": 1},
    }
    with pytest.raises(StudyConfigError, match="collectives.ranks: 1: on one node"):
        load_study({}, cli=base)
    across = {**base, "collectives": {**base["collectives"], "nodes": 2}}
    assert load_study({}, cli=across).settings["collectives"]["nodes"] == 2


def test_several_node_ranks_talk_over_the_interface_set(make_spec, monkeypatch):
    spec = make_spec(launcher="torchrun", ranks=1, nodes=2, threads=1, batch_size=8)
    monkeypatch.delenv("STUDY_NETWORK_INTERFACE", raising=False)
    env = TORCHRUN.environment(spec, starter="srun")
    assert "GLOO_SOCKET_IFNAME" not in env and env["MASTER_ADDR"] != "127.0.0.1"
    monkeypatch.setenv("STUDY_NETWORK_INTERFACE", "lo")
    env = TORCHRUN.environment(spec, starter="srun")
    assert env["GLOO_SOCKET_IFNAME"] == env["CCL_KVS_IFACE"] == "lo"
    assert env["MASTER_ADDR"] == "127.0.0.1" == interface_address("lo")
    assert interface_address("no-such-if0") is None


def test_a_rendezvous_port_is_one_no_socket_bound_to_port_0_can_take(make_spec):
    """Rank 0's store listens on its port seconds after the launcher drew it, while srun
    (or mpirun) binds listeners of its own to port 0: a port drawn from the kernel's
    ephemeral range could go to one of them first (the two-node collectives job once
    failed so: "The server socket has failed to listen on any local network address").
    The port is free and outside that range, and differs from launch to launch."""
    ephemeral = ephemeral_ports()
    ports = {free_port() for _ in range(20)}
    assert len(ports) > 1 and not [p for p in ports if p in ephemeral], ports
    held = []
    try:
        for _ in range(300):  # as srun's listeners and any connection would
            s = socket.socket()
            held.append(s)
            s.bind(("", 0))
            assert s.getsockname()[1] in ephemeral
            assert s.getsockname()[1] not in ports
        for port in ports:  # and each is free
            with socket.socket() as s:
                s.bind(("", port))
    finally:
        for s in held:
            s.close()
    spec = make_spec(launcher="torchrun", ranks=1, nodes=2, threads=1, batch_size=8)
    assert int(TORCHRUN.environment(spec, starter="srun")["MASTER_PORT"]) not in ephemeral
    # none outside free after its tries: any free port
    assert free_port(tries=0) in ephemeral


def test_several_node_ccl_ranks_name_the_provider_between_their_nodes(make_spec, monkeypatch):
    """oneCCL's shm transport on several nodes: shm within a node, and between the nodes
    the provider of cluster.fabric_provider (tcp unless set; empty: libfabric's own first
    choice, which was shm itself on a TCP-only network); on one node, none is named."""
    spec = make_spec(launcher="torchrun", ranks=1, nodes=2, threads=1, batch_size=8,
                     dist_backend="ccl")  # fmt: skip
    assert spec["ccl_transport"] == "shm"
    monkeypatch.delenv("STUDY_FABRIC_PROVIDER", raising=False)
    env = TORCHRUN.environment(spec, starter="srun")
    assert env["CCL_ATL_SHM"] == "1" and env["FI_PROVIDER"] == "tcp"
    monkeypatch.setenv("STUDY_FABRIC_PROVIDER", "verbs")
    assert TORCHRUN.environment(spec, starter="srun")["FI_PROVIDER"] == "verbs"
    monkeypatch.setenv("STUDY_FABRIC_PROVIDER", "")
    assert "FI_PROVIDER" not in TORCHRUN.environment(spec, starter="srun")
    one = make_spec(launcher="torchrun", ranks=2, threads=1, dist_backend="ccl")
    assert "FI_PROVIDER" not in TORCHRUN.environment(one)
    tcp = make_spec(launcher="torchrun", ranks=2, threads=1, dist_backend="ccl",
                    ccl_transport="tcp")  # fmt: skip
    assert TORCHRUN.environment(tcp)["FI_PROVIDER"] == "tcp"
    # the setting: tcp by default, a provider's name, or null; nothing else
    assert load_study({}, cli={"groups": {"g": {"runs": [{"id": "x"}]}}}).settings["cluster"][
        "fabric_provider"] == "tcp"  # fmt: skip
    chosen = {"groups": {"g": {"runs": [{"id": "x"}]}}, "cluster": {"fabric_provider": None}}
    assert load_study({}, cli=chosen).settings["cluster"]["fabric_provider"] is None
    with pytest.raises(StudyConfigError, match="cluster.fabric_provider"):
        load_study(
            {},
            cli={"groups": {"g": {"runs": [{"id": "x"}]}}, "cluster": {"fabric_provider": "a b"}},
        )


def test_builds_on_compute_nodes_need_the_local_runtime():
    assert sizing.builds_local(settings()) is True
    compute = settings(build_on="compute")
    assert sizing.builds_local(compute) is False
    assert sizing.build_problem(compute, container=False) is None
    problem = sizing.build_problem(compute, container=True)
    assert problem.startswith("config error at cluster.build_on: 'compute' builds images")
    assert "use runtime: local" in problem
    assert sizing.build_problem(settings(), container=True) is None


SACCT_TIMEOUT = "31|TIMEOUT|0:0|study-node1|00:01:18|00:01:00|2026-11-25T20:13:44\n"


def fake_sacct(text: str = SACCT_TIMEOUT, code: int = 0, err: str = ""):
    def run(cmd, **kwargs):
        assert cmd[0] == "sacct" and "-j" in cmd
        return subprocess.CompletedProcess(cmd, code, text, err)

    return run


def test_a_job_lost_whole_reads_as_slurm_tells_it():
    job = slurm.job_end("31", run=fake_sacct())
    assert job["state"] == "TIMEOUT" and job["nodes"] == "study-node1"
    kind, words = slurm.lost_job(job)
    assert kind == "SlurmTimeLimit"
    assert words.startswith("SLURM's accounting: job 31 TIMEOUT on study-node1 after 00:01:18")
    for state, kind in (("NODE_FAIL", "SlurmNodeFailure"), ("PREEMPTED", "SlurmPreempted"),
                        ("OUT_OF_MEMORY", "SlurmOutOfMemory"), ("CANCELLED by 0", "SlurmCancelled"),
                        ("FAILED", "SlurmJobFailed")):  # fmt: skip
        assert slurm.lost_job({**job, "state": state})[0] == kind
    assert slurm.lost_job({**job, "state": "RUNNING"}) is None
    assert slurm.lost_job({**job, "state": "COMPLETED"}) is None
    assert slurm.job_end("32", run=fake_sacct()) is None  # no such job
    no_db = fake_sacct("", 1, "sacct: error: Slurm accounting storage is disabled")
    with pytest.raises(slurm.NoAccounting, match="accounting storage is disabled"):
        slurm.job_end("31", run=no_db)


def test_the_next_attempt_of_a_lost_trial_job(tmp_path):
    from workflow_scripts.trial import lost

    out, log = tmp_path / "trial0.json", tmp_path / "t.log"
    assert lost.earlier_loss(out, "40", log, run=fake_sacct()) is None  # no marker: none
    lost.marker(out).write_text('{"slurm_job_id": "31"}')
    kind, words = lost.earlier_loss(out, "40", log, run=fake_sacct())
    assert kind == "SlurmTimeLimit" and "job 31 TIMEOUT" in words
    assert lost.earlier_loss(out, "31", log, run=fake_sacct()) is None  # its own job
    # interrupted (SLURM signals before it kills): its own ends make the record, a
    # cancellation (maybe Snakemake's own stop, a resumed study's first attempt) runs the
    # trial again
    lost.marker(out).write_text('{"slurm_job_id": "31", "interrupted": true}')
    assert lost.earlier_loss(out, "40", log, run=fake_sacct())[0] == "SlurmTimeLimit"
    cancelled = fake_sacct(SACCT_TIMEOUT.replace("TIMEOUT", "CANCELLED by 0"))
    assert lost.earlier_loss(out, "40", log, run=cancelled) is None
    # ... unless Snakemake retries the job (its attempt 2): the earlier job failed while
    # Snakemake ran, so it was not Snakemake's own stop
    assert lost.earlier_loss(out, "40", log, run=cancelled, attempt=2)[0] == "SlurmCancelled"
    lost.marker(out).write_text('{"slurm_job_id": "31"}')  # killed: no word from the trial
    assert lost.earlier_loss(out, "40", log, run=cancelled)[0] == "SlurmCancelled"
    # without accounting: said in the log, and the trial runs again
    no_db = fake_sacct("", 1, "sacct: error: Slurm accounting storage is disabled")
    assert lost.earlier_loss(out, "40", log, run=no_db) is None
    said = log.read_text()
    assert "the trial's earlier job 31 ended without its record" in said
    assert "accounting storage is disabled" in said and "running the trial again" in said


def test_a_job_slurm_runs_elsewhere_than_its_plan_stops(monkeypatch):
    """A study planned for this host whose job SLURM runs on another (submitted with
    --executor slurm, without the profile or cluster.scheduler) stops before measuring;
    one planned for the nodes, or run inside an allocation on its own host, goes on."""
    import socket

    from workflow_scripts.study.entry import check_job_host

    here = socket.gethostname()
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    check_job_host("host login-7")  # not in a SLURM job: a local run's subprocess
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    check_job_host(f"host {here}")  # in an allocation on the host it was planned on
    check_job_host("nodes partition 'cpu': 2 node(s) of 4 CPUs and 8000 MB (sinfo)")
    with pytest.raises(StudyConfigError) as caught:
        check_job_host("host login-7")
    message = str(caught.value)
    assert message.startswith("config error at cluster.scheduler: this job runs in SLURM job 42")
    assert "planned for the host login-7" in message and "--profile profiles/slurm" in message


def test_trials_are_blocked_by_node_where_the_study_knows_its_nodes(make_spec, monkeypatch):
    one = make_spec(id="a")
    across = make_spec(id="b", launcher="torchrun", ranks=1, threads=1, nodes=2)
    on = settings()
    monkeypatch.delenv(slurm.NODES_VAR, raising=False)
    assert sizing.block_node(on, one, 0, 0) == ""  # no node list: SLURM places it
    monkeypatch.setenv(slurm.NODES_VAR, "n1,n2,n3")
    # trial k of the i-th experiment on node (k + i) mod 3: each experiment's trials
    # rotate through the nodes, a round's trials spread over them
    placed = [[sizing.block_node(on, one, i, k) for k in range(3)] for i in range(3)]
    assert placed[0] == [" --nodelist=n1", " --nodelist=n2", " --nodelist=n3"]
    assert placed[1] == [" --nodelist=n2", " --nodelist=n3", " --nodelist=n1"]
    assert {row[0] for row in placed} == {" --nodelist=n1", " --nodelist=n2", " --nodelist=n3"}
    # a job submitted again (its node may have failed), a several-node trial, blocking off
    assert sizing.block_node(on, one, 0, 0, attempt=2) == ""
    assert sizing.block_node(on, across, 0, 0) == ""
    assert sizing.block_node(settings(block_by_node=False), one, 0, 0) == ""


def test_the_plugins_status_checks_are_at_most_the_bound_apart(monkeypatch):
    """The SLURM plugin's wait between job-state checks grows by 10 s after every check
    that finds no job ended, up to 3 minutes; bounded (profiles/slurm/Snakefile), it
    never exceeds Snakemake's --seconds-between-status-checks, through the plugin's own
    code path (its reset when no job is active, with the plugin's default of 40 s)."""
    import asyncio
    import logging
    from types import SimpleNamespace

    from snakemake_executor_plugin_slurm import Executor

    # (restored after the test: the class is the plugin's own)
    monkeypatch.setattr(Executor, "next_seconds_between_status_checks",
                        Executor.next_seconds_between_status_checks)  # fmt: skip
    executor = object.__new__(Executor)
    executor.workflow = SimpleNamespace(
        executor_settings=SimpleNamespace(init_seconds_before_status_checks=40),
        remote_execution_settings=SimpleNamespace(seconds_between_status_checks=10),
    )
    executor.logger = logging.getLogger("test")
    executor._next_seconds_between_status_checks = None

    async def check():
        async for _ in executor.check_active_jobs([]):
            pass

    asyncio.run(check())
    assert executor.next_seconds_between_status_checks == 40  # (unbounded: the plugin's)
    assert slurm.bound_status_checks()
    asyncio.run(check())
    assert executor.next_seconds_between_status_checks == 10
    for _ in range(20):  # the plugin's backoff, as it writes it after a quiet check
        executor.next_seconds_between_status_checks = min(
            executor.next_seconds_between_status_checks + 10, 180
        )
        assert executor.next_seconds_between_status_checks == 10
    # another bound said (--seconds-between-status-checks 7); none said: Snakemake's own
    executor.workflow.remote_execution_settings.seconds_between_status_checks = 7
    assert executor.next_seconds_between_status_checks == 7
    executor.workflow.remote_execution_settings = None
    executor.next_seconds_between_status_checks = 180
    assert executor.next_seconds_between_status_checks == slurm.STATUS_CHECKS_S == 10
