"""Launcher ``accelerate`` (workflow_scripts/launchers/accelerate.py): the config file
the study writes and the ranks' variables under mpirun. (Real trials through
``accelerate launch``: tests/test_accelerate_launch.py.)"""

from __future__ import annotations

from tests.trials import bert
from workflow_scripts import launchers
from workflow_scripts.rank.distributed import ranks

ACCELERATE = launchers.get("accelerate")


def test_the_config_file_says_what_the_spec_asks(make_spec):
    one = ACCELERATE.config(bert(make_spec, launcher="accelerate", precision="bf16"), "/h")
    assert one == {
        "compute_environment": "LOCAL_MACHINE",
        "distributed_type": "NO",
        "use_cpu": True,
        "num_processes": 1,
        "num_machines": 1,
        "machine_rank": 0,
        "mixed_precision": "bf16",
    }
    two = ACCELERATE.config(bert(make_spec, launcher="accelerate", ranks=2), "/tmp/hosts")
    assert two["distributed_type"] == "MULTI_CPU" and two["num_processes"] == 2
    assert two["mpirun_config"] == {"mpirun_hostfile": "/tmp/hosts"}
    assert two["mixed_precision"] == "no" and "ipex_config" not in two
    spec = bert(make_spec, launcher="accelerate", backend="ipex", accelerate_ipex=True)
    assert ACCELERATE.config(spec, "/h")["ipex_config"] == {"ipex": True}
    # one process runs in the backend's environment, several in oneccl's (mpirun)
    assert spec["env"] == "ipex"
    assert bert(make_spec, launcher="accelerate", ranks=2)["env"] == "oneccl"


def test_mpi_ranks_take_torchs_variables():
    env = {"STUDY_RANKS_FROM": "mpi", "PMI_RANK": "1", "PMI_SIZE": "2",
           "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2"}  # fmt: skip
    assert ranks.adopt_mpi(env)
    assert (env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"], env["LOCAL_WORLD_SIZE"]) == (
        "1", "2", "1", "2",
    )  # fmt: skip
    open_mpi = {"STUDY_RANKS_FROM": "mpi", "OMPI_COMM_WORLD_RANK": "3",
                "OMPI_COMM_WORLD_SIZE": "4"}  # fmt: skip
    assert ranks.adopt_mpi(open_mpi) and open_mpi["LOCAL_RANK"] == "3"
    assert not ranks.adopt_mpi({"PMI_RANK": "0", "PMI_SIZE": "2"})  # not launched so
    assert not ranks.adopt_mpi({"STUDY_RANKS_FROM": "mpi"})
