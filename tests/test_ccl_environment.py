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


def test_the_effective_config_lists_oneccls_variables():
    env = {"CCL_ATL_SHM": "1", "FI_PROVIDER_PATH": "/x", "PATH": "/bin", "LOCAL_RANK": "0"}
    assert ccl.effective_config(env) == {"CCL_ATL_SHM": "1", "FI_PROVIDER_PATH": "/x"}
