"""What the slow tests need from outside the workflow's virtualenv, got by the tests
that need it, whatever order they run in: Debian packages (podman, chromium, the
allocators) through tests/install.sh; the SLURM cluster of two nodes on this machine
through tests/slurm/cluster.sh (which installs SLURM's packages itself). The backend
environments come from the workflow's own envs.build (conftest.py). Each component has
a marker (torch, podman, slurm, browser), so that `-m` selects tests by what they need:
conftest.py gives the marker to every test that uses the component's fixture, and the
fixture to every test that carries the marker."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from pathlib import Path

import pytest

INSTALL = Path(__file__).resolve().parent / "install.sh"
CLUSTER = Path(__file__).resolve().parent / "slurm" / "cluster.sh"
#: the test cluster: its nodes, and each node's memory (MB), which SLURM enforces
NODES = ("study-node1", "study-node2")
#: its ClusterName (tests/slurm/cluster.sh), in every job's environment
CLUSTER_NAME = "study-test"
NODE_MEM_MB = 4096
#: its MpiDefault, as many sites set it: srun adds PMIx variables to every task (and
#: srun --mpi=pmi2 is there too)
MPI = "pmix"

#: Debian's packages for each component that is one
PACKAGES = {
    # the container tests build every image (mmdebstrap makes the base) and run in them
    "podman": ("podman", "runc", "mmdebstrap"),
    # the report in a real browser
    "browser": ("chromium",),
    # run_cpu's jemalloc and tcmalloc (local runs; the images install their own)
    "allocators": ("libjemalloc2", "libgoogle-perftools4"),
}


@functools.cache
def install(component: str) -> None:
    """Install the component's packages where they are missing; a clear failure where
    that cannot be done (no apt-get, no root or sudo, no mirror)."""
    cmd = ["bash", str(INSTALL), *PACKAGES[component]]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if proc.stdout:
        print(proc.stdout)
    if proc.returncode != 0:
        pytest.fail(f"{component}: could not install {' '.join(PACKAGES[component])}:\n"
                    f"{proc.stderr[-3000:]}", pytrace=False)  # fmt: skip


@functools.cache
def program(component: str, *names: str) -> str:
    """The component installed, the path of its program (the first of names found)."""
    install(component)
    for name in names:
        path = shutil.which(name)
        if path:
            return path
    pytest.fail(f"{component}: installed, but none of {names} is on PATH", pytrace=False)


def cluster(action: str, state: Path) -> subprocess.CompletedProcess:
    """tests/slurm/cluster.sh start|stop|status for the test cluster (its packages
    installed by the script itself), with its state in the folder given."""
    env = {**os.environ, "STUDY_SLURM_DIR": str(state), "STUDY_SLURM_NODES": str(len(NODES)),
           "STUDY_SLURM_MEM_MB": str(NODE_MEM_MB), "STUDY_SLURM_MPI": MPI,
           "STUDY_SLURM_ACCOUNTING": "1"}  # fmt: skip
    return subprocess.run(
        ["bash", str(CLUSTER), action], capture_output=True, text=True, timeout=900, env=env
    )


def cluster_processes() -> dict[int, str]:
    """The processes of the test cluster's jobs still running on this machine (by the
    cluster's name in their environment): pid -> command line."""
    mark = f"SLURM_CLUSTER_NAME={CLUSTER_NAME}".encode()
    found = {}
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            if mark in environ.read_bytes().split(b"\0"):
                cmd = (environ.parent / "cmdline").read_bytes().replace(b"\0", b" ")
                found[int(environ.parent.name)] = cmd.decode(errors="replace")[:300]
        except OSError:
            continue
    return found
