"""What each job asks a cluster for: the rules' Snakemake resources, which the SLURM
executor plugin turns into sbatch options (``snakemake --profile profiles/slurm``).

A measured job (a trial, a calibration, the allreduce microbenchmark) takes whole
nodes (``--exclusive``: a shared node ruins the measurement) and asks for the CPUs it
runs on, its memory (a rough estimate, with room) and a time limit derived from its
own timeout. A trial of several ranks is a job of ``nodes`` x ``ranks`` tasks, one CPU
block (``threads``) per task, whose ranks ``srun`` starts (the ``mpi`` resource
tells the plugin so); the collectives benchmark's ranks likewise, on one node. The
other jobs (environment and image builds, data, the report) ask for little and share
nodes.

Locally Snakemake gives these resources no limit (no ``--resources``); measured jobs
there take every core Snakemake was given instead (``threads``), so that no two
measurements overlap. Standard library only.
"""

from __future__ import annotations

import math
import os

from .. import launchers, workloads
from ..sysinfo import parse_cpu_list, plan_cpus

EXCLUSIVE = "--exclusive"
#: minutes a measured job needs besides its runs (starting Snakemake, the environment)
SETUP_MIN = 10
#: room over the rough memory estimate (workloads.estimated_memory_mb)
MEMORY_FACTOR = 1.5
MEMORY_FLOOR_MB = 2048


def node_cpus(spec: dict | None = None) -> int:
    """The CPUs of the node a measured job runs on: the spec's CPU list, else what the
    study was planned on (:func:`~workflow_scripts.sysinfo.plan_cpus`)."""
    if spec and spec.get("cpus"):
        return len(parse_cpu_list(spec["cpus"]))
    return len(plan_cpus())


def node_mem_mb() -> int | None:
    """The memory of the nodes the study was planned for (MB; None: not on a cluster,
    or not known)."""
    from .slurm import NODE_MEM_VAR

    value = os.environ.get(NODE_MEM_VAR, "")
    return int(value) if value.isdigit() else None


def whole_node_mb(estimate_mb: float) -> int:
    """A whole-node job's memory: the node's (the job holds the node anyway), else a
    request with room over the estimate."""
    return node_mem_mb() or memory_mb(estimate_mb)


def placement(settings: dict) -> dict:
    """Where the measured jobs go: the ``cluster`` setting's partition, account and
    node features, as the executor plugin's resources (unset ones are left out, so
    that a profile's ``--default-resources`` still applies)."""
    c = settings.get("cluster") or {}
    names = {"partition": "slurm_partition", "account": "slurm_account",
             "constraint": "constraint"}  # fmt: skip
    return {res: c[key] for key, res in names.items() if c.get(key)}


def runtime_min(seconds: float) -> int:
    return math.ceil(seconds / 60) + SETUP_MIN


def memory_mb(mb: float) -> int:
    """A request in whole GiB, with room over an estimate."""
    return max(MEMORY_FLOOR_MB, 1024 * math.ceil(mb * MEMORY_FACTOR / 1024))


def experiment(spec: dict, settings: dict) -> dict:
    """The resources of a trial's job (``mpi`` None: a single-task job, which the plugin
    runs as a one-task step)."""
    launcher = launchers.get(spec["launcher"])
    world = launcher.ranks(spec)
    per_node = int(spec["ranks"]) if launcher.distributed else 1
    cpus = node_cpus(spec)
    per_task = (spec["threads"] or max(1, cpus // per_node)) if world > 1 else cpus
    attempts = 1 + int(settings["noise_retries"])
    extra = EXCLUSIVE if world == 1 else f"{EXCLUSIVE} --ntasks-per-node={per_node}"
    return {
        "cpus_per_task": per_task,
        "tasks": world,
        "nodes": launchers.nodes(spec),
        "mem_mb": whole_node_mb(workloads.estimated_memory_mb(spec) * per_node),
        "runtime": runtime_min(attempts * (spec["timeout_s"] + 5)),
        "slurm_extra": extra,
        "mpi": "srun" if world > 1 else None,
        **placement(settings),
    }


def block_node(settings: dict, spec: dict, index: int, trial: int, attempt: int = 1) -> str:
    """The ``--nodelist`` of trial ``trial`` of the ``index``-th experiment (``spec``)
    where the study blocks its trials by node (``cluster.block_by_node``): node
    ``(trial + index) mod N`` of the N nodes it was planned on (:data:`slurm.NODES_VAR`).
    Each experiment's trials rotate through the nodes and a round's trials spread over
    them; two experiments of as many trials (a multiple of N) share their nodes in equal
    shares, and where shares differ the interval carries the node-to-node spread
    (report/uncertainty.node_term). "" (SLURM places it): blocking off, no node list
    (a cluster described in the config), a several-node trial, or a job submitted again
    (its node may be the one that failed)."""
    from . import slurm

    names = [n for n in os.environ.get(slurm.NODES_VAR, "").split(",") if n]
    c = settings.get("cluster") or {}
    if not c.get("block_by_node") or not names or attempt > 1 or launchers.nodes(spec) > 1:
        return ""
    return f" --nodelist={names[(int(trial) + int(index)) % len(names)]}"


def calibration(settings: dict) -> dict:
    from ..calibration import TIMEOUT_S

    return {
        "cpus_per_task": node_cpus(),
        "mem_mb": whole_node_mb(2048),
        "runtime": runtime_min(TIMEOUT_S),
        "slurm_extra": EXCLUSIVE,
        **placement(settings),
    }


def collectives(settings: dict) -> dict:
    """The resources of an allreduce microbenchmark's job: its ranks are started like a
    trial's (one task per rank, by srun), on one node; the job holds the most ranks it
    runs (each smaller count is an srun inside it)."""
    from ..collectives import TIMEOUT_S, rank_counts

    c = settings["collectives"]
    nodes = c.get("nodes") or 1
    ranks = max(rank_counts(c["ranks"], len(plan_cpus()), nodes))  # per node
    return {
        "cpus_per_task": max(1, node_cpus() // ranks),
        "tasks": ranks * nodes,
        "nodes": nodes,
        "mem_mb": whole_node_mb(1024 * ranks),
        "runtime": runtime_min(TIMEOUT_S),
        "slurm_extra": f"{EXCLUSIVE} --ntasks-per-node={ranks}",
        "mpi": "srun",
        **placement(settings),
    }


#: the other jobs: (CPUs, memory MB, minutes)
SETUP = {
    "build_env": (2, 4096, 60),
    "build_image": (2, 8192, 90),
    "wheelhouse": (1, 2048, 60),
    "data": (1, 2048, 15),
    "report": (1, 4096, 20),
}


def builds_local(settings: dict) -> bool:
    """Whether the environment and image builds run on the submit host (``cluster.build_on``
    login, the default) rather than as cluster jobs."""
    return (settings.get("cluster") or {}).get("build_on", "login") == "login"


def build_problem(settings: dict, container: bool) -> str | None:
    """Why the builds cannot run where the setting says (None: they can). An image built
    in a compute job lands in that node's engine storage, which the other nodes do not
    share (and its archive job may run on yet another node)."""
    if not builds_local(settings) and container:
        return (
            "config error at cluster.build_on: 'compute' builds images in a cluster job, "
            "whose node's engine storage the other nodes do not share; use runtime: local "
            "(environments on the shared filesystem), or build_on: login"
        )
    return None


def setup(kind: str) -> dict:
    """(On a cluster the wheelhouse, data and report jobs run on the submit host, and the
    builds too unless ``cluster.build_on`` is compute: rules/common.smk.) Never more
    than a node has: a build sent to the nodes must fit one."""
    cpus, mem, minutes = SETUP[kind]
    mem = min(mem, node_mem_mb() or mem)
    return {"cpus_per_task": min(cpus, node_cpus()), "mem_mb": mem, "runtime": minutes}
