"""What registering the ccl backend sets for oneCCL before it loads (standard library
only, no oneCCL needed): the launcher variables of a non-MPI launch, the worker's
affinity, and the configuration a trial records."""

from __future__ import annotations

import os

from workflow_scripts.rank.distributed import ccl


def test_a_torchrun_rank_tells_oneccl_it_has_no_mpi_launcher():
    env = {"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4", "RANK": "5"}
    set_here = ccl.launcher_environment(env)
    assert set_here == {"CCL_PROCESS_LAUNCHER": "none", "CCL_LOCAL_RANK": "1",
                        "CCL_LOCAL_SIZE": "4"}  # fmt: skip
    assert env["CCL_PROCESS_LAUNCHER"] == "none"


def test_an_mpi_rank_keeps_oneccls_own_launcher_detection():
    env = {"LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2", "PMI_RANK": "0"}
    assert ccl.launcher_environment(env) == {}
    assert "CCL_PROCESS_LAUNCHER" not in env


def test_what_the_user_set_wins():
    env = {"LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2", "CCL_PROCESS_LAUNCHER": "pmix"}
    assert "CCL_PROCESS_LAUNCHER" not in ccl.launcher_environment(env)
    assert env["CCL_PROCESS_LAUNCHER"] == "pmix"


def test_the_offload_worker_is_pinned_inside_the_ranks_block():
    env = {"LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2", "CCL_WORKER_OFFLOAD": "1"}
    ccl.launcher_environment(env)
    assert env["CCL_WORKER_AFFINITY"] == str(max(os.sched_getaffinity(0)))
    off = {"LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2", "CCL_WORKER_OFFLOAD": "0"}
    assert "CCL_WORKER_AFFINITY" not in ccl.launcher_environment(off)


def test_an_srun_rank_on_a_pmi_site_is_no_mpi_launch():
    """A site's MpiDefault=pmi2 (or pmix) makes srun add PMI variables to every task:
    ranks the study started with srun still tell oneCCL they have no MPI launcher."""
    env = {"STUDY_RANKS_FROM": "slurm", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
           "PMI_RANK": "3", "PMI_SIZE": "4", "PMI_FD": "7", "SLURM_MPI_TYPE": "pmi2"}  # fmt: skip
    want = {"CCL_PROCESS_LAUNCHER": "none", "CCL_LOCAL_RANK": "1", "CCL_LOCAL_SIZE": "2"}
    assert ccl.launcher_environment(env) == want
    pmix = {"STUDY_RANKS_FROM": "slurm", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
            "PMIX_RANK": "0", "PMIX_NAMESPACE": "slurm.pmix.5.0"}  # fmt: skip
    assert ccl.launcher_environment(pmix)["CCL_PROCESS_LAUNCHER"] == "none"
    # mpirun's ranks (launcher accelerate) stay Hydra's
    mpi = {"STUDY_RANKS_FROM": "mpi", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2", "PMI_RANK": "0"}
    assert ccl.launcher_environment(mpi) == {}
    # the record says how the rank was started
    assert ccl.effective_config(env)["launch"] == {
        "STUDY_RANKS_FROM": "slurm", "SLURM_MPI_TYPE": "pmi2", "PMI_RANK": "3", "PMI_SIZE": "4",
        "PMI_FD": "7",
    }  # fmt: skip


def test_the_effective_config_lists_oneccls_variables():
    env = {"CCL_ATL_SHM": "1", "FI_PROVIDER_PATH": "/x", "PATH": "/bin", "LOCAL_RANK": "0"}
    assert ccl.effective_config(env) == {"CCL_ATL_SHM": "1", "FI_PROVIDER_PATH": "/x",
                                         "launch": {}}  # fmt: skip


def test_the_worker_affinity_lists_every_local_ranks_worker():
    """oneCCL reads CCL_WORKER_AFFINITY as one CPU per worker of every local rank (with 2
    local ranks a single value fails: 'failed to parse worker affinity', as the default
    study's pre-flight found): each rank computes the whole list, its own in its place."""
    from workflow_scripts.rank.distributed import ranks

    allowed = list(range(8))
    spec = {"dist_backend": "ccl", "ccl_worker_offload": True, "comm_cpu": False,
            "threads": 2, "cpus": None}  # fmt: skip
    assert ranks.worker_affinity(spec, 4, allowed, {}) == "1,3,5,7"
    # a reserved comm_cpu: the last CPU of each rank's block (threads 4: 3 + 1)
    reserved = {**spec, "comm_cpu": True, "ccl_worker_offload": False, "threads": 4}
    assert ranks.worker_affinity(reserved, 2, allowed, {}) == "3,7"
    assert [ranks.reserve_comm_cpu(ranks.rank_cpus(reserved, r, 2, allowed))[1]
            for r in range(2)] == [3, 7]  # fmt: skip
    # the worker off, or Gloo: nothing to place
    assert ranks.worker_affinity({**spec, "ccl_worker_offload": False}, 4, allowed, {}) is None
    assert ranks.worker_affinity({**spec, "dist_backend": "gloo"}, 4, allowed, {}) is None


#: rank 0's output at the start of a 2-rank process group, oneCCL 2021.14 at log level
#: info (recorded here: CCL_ATL_SHM=1, and CCL_ATL_SHM=0 with FI_PROVIDER=tcp), cut
SHM_START = """\
2026:11:26-06:42:27:(32681) |CCL_WARN| value of CCL_LOG_LEVEL changed to be info (default:warn)
2026:11:26-06:42:27:(32681) |CCL_WARN| value of CCL_WORKER_OFFLOAD changed to be 0 (default:1)
2026:11:26-06:42:27:(32681) |CCL_INFO| process launcher: none, local_proc_idx: 0
2026:11:26-06:42:28:(32681) |CCL_INFO| libfabric version: 1.21.0-impi
2026:11:26-06:42:28:(32681) |CCL_INFO| provider: shm
2026:11:26-06:42:28:(32681) |CCL_INFO|   nic: { name shm:shm, no link attr }
2026:11:26-06:42:28:(32681) |CCL_INFO|   mr_mode: 0
a line of someone else's
2026:11:26-06:42:28:(32681) |CCL_INFO| provider: shm
2026:11:26-06:42:28:(32681) |CCL_INFO|   nic: { name shm:shm, no link attr }
2026:11:26-06:42:28:(32681) |CCL_INFO| atl-ofi:
{
  prov_count: 2
  nw_prov_count: 1
  nw_prov_first_idx: 1
}
2026:11:26-06:42:28:(32681) |CCL_WARN| could not open the library: libmpi.so.12
2026:11:26-06:42:37:(32713) |CCL_INFO| FI_PROVIDER: <not specified>
"""
TCP_START = """\
2026:11:26-06:42:53:(  767) |CCL_INFO| provider: tcp
2026:11:26-06:42:53:(  767) |CCL_INFO|   nic: { name tcp:lo, state unknown }
2026:11:26-06:42:53:(  767) |CCL_INFO| atl-ofi:
{
  prov_count: 1
  nw_prov_count: 1
  nw_prov_first_idx: 0
}
"""


def test_the_providers_oneccl_opened_are_read_from_its_log():
    assert ccl.read_providers(SHM_START) == {
        "providers": ["shm", "shm"], "nics": ["shm:shm", "shm:shm"],
        "libfabric": "1.21.0-impi", "network_first": 1}  # fmt: skip
    assert ccl.read_providers(TCP_START) == {
        "providers": ["tcp"], "nics": ["tcp:lo"], "network_first": 0}  # fmt: skip
    # the other ranks (and a level that hides them) name none
    assert ccl.read_providers("2026:11:26-06:42:27:(1) |CCL_WARN| could not open\n") is None


#: a rank's group start that writes ``SHM_START`` (from the environment) to its stdout
WRITES_THE_LOG = """
import os
from workflow_scripts.rank.distributed import ccl
with ccl.ccl_output() as out:
    os.write(1, os.environ["LOG"].encode())
assert out["text"] == os.environ["LOG"]
"""


def test_only_the_lines_the_study_asked_for_are_kept_from_the_log():
    """The study's own log level (info) adds oneCCL's info lines and their multi-line
    values: they go, its warnings and everyone else's lines stay (and the record still
    reads all of them). A level the user set is theirs: all of it stays."""
    import os
    import subprocess
    import sys

    from tests.conftest import REPO

    def passed_on(raised: bool) -> str:
        env = {**os.environ, "LOG": SHM_START}
        env.pop(ccl.RAISED_VAR, None)
        env.update({ccl.RAISED_VAR: "1"} if raised else {})
        run = subprocess.run([sys.executable, "-c", WRITES_THE_LOG], cwd=REPO, env=env,
                             timeout=60, capture_output=True, text=True)  # fmt: skip
        assert run.returncode == 0, run.stderr
        return run.stdout

    assert passed_on(raised=True).splitlines() == [
        "2026:11:26-06:42:27:(32681) |CCL_WARN| value of CCL_WORKER_OFFLOAD changed to be 0 "
        "(default:1)",
        "a line of someone else's",
        "2026:11:26-06:42:28:(32681) |CCL_WARN| could not open the library: libmpi.so.12",
    ]
    assert passed_on(raised=False) == SHM_START


#: a rank whose group start writes oneCCL's lines, then hangs until it is killed
HANGS_IN_START = """
import os, signal, time
from workflow_scripts.rank.distributed import ccl
os.environ[ccl.RAISED_VAR] = "1"
print("before the start", flush=True)
with ccl.ccl_output() as out:
    os.write(1, b"2026:11:26-06:42:27:(1) |CCL_WARN| could not connect: retrying\\n"
                b"2026:11:26-06:42:28:(1) |CCL_INFO| provider: shm\\n")
    print("torch's own line", flush=True)
    time.sleep(1)
    os.kill(os.getpid(), signal.SIGKILL)
"""
CLEAN_START = """
import os
from workflow_scripts.rank.distributed import ccl
os.environ[ccl.RAISED_VAR] = "1"
with ccl.ccl_output() as out:
    os.write(1, b"2026:11:26-06:42:28:(1) |CCL_INFO| provider: tcp\\n")
print("after:", ccl.read_providers(out["text"])["providers"], flush=True)
"""


def test_a_group_start_killed_midway_keeps_oneccls_warnings_in_the_log():
    """The start's output goes on to the log as it comes: a start that hangs until its
    rank is killed (SIGKILL: no cleanup runs) leaves oneCCL's warnings (and any other
    line) in the log, and only the info lines read for the record are held back."""
    import subprocess
    import sys

    from tests.conftest import REPO

    killed = subprocess.run([sys.executable, "-c", HANGS_IN_START], cwd=REPO, timeout=60,
                            capture_output=True, text=True)  # fmt: skip
    assert killed.returncode == -9
    assert killed.stdout.splitlines() == [
        "before the start",
        "2026:11:26-06:42:27:(1) |CCL_WARN| could not connect: retrying",
        "torch's own line",
    ]
    clean = subprocess.run([sys.executable, "-c", CLEAN_START], cwd=REPO, timeout=60,
                           capture_output=True, text=True)  # fmt: skip
    assert clean.returncode == 0, clean.stderr
    assert clean.stdout.splitlines() == ["after: ['tcp']"]


def test_the_studys_log_level_is_told_from_the_users():
    """The level that names oneCCL's providers is set where none is, and again where a
    parent process of the study set it (its ranks inherit it); a level of the user's is
    left as it is (and then all of oneCCL's lines go on to the log)."""
    env = {}
    assert ccl.raise_log_level(env) is True
    assert env == {"CCL_LOG_LEVEL": "info", ccl.RAISED_VAR: "1"}
    inherited = dict(env)
    assert ccl.raise_log_level(inherited) is True
    users = {"CCL_LOG_LEVEL": "debug"}
    assert ccl.raise_log_level(users) is False and users == {"CCL_LOG_LEVEL": "debug"}
    assert ccl.raise_log_level({"CCL_LOG_LEVEL": "info"}) is False
