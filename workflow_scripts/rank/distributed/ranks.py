"""Inside one rank of a data-parallel trial: who it is, which CPUs it owns, its process
group.

A launcher that starts N ranks (torchrun) sets ``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT`` in each; under srun
(``STUDY_RANKS_FROM=slurm``) each rank takes them from SLURM's task variables
(:func:`adopt_slurm`). The trial's CPUs (the
spec's ``cpus``, or all the process may use) are cut into N blocks, one per rank, on
the machine's topology read from sysfs (:func:`rank_blocks`: whole physical cores per
rank, physical cores before SMT siblings, within a NUMA node where a block fits), so
the ranks never share a core; each rank runs ``threads`` intra-op threads (the block's
size when unset). Standard library only at import time: the
pinning runs before torch starts its thread pools.
"""

from __future__ import annotations

import datetime
import os

from ... import experiment, sysinfo
from ...sysinfo import parse_cpu_list

#: the process group's timeout when the spec's own timeout is longer: a dead peer
#: makes the others fail this long after, instead of hanging to the trial's timeout
MAX_PG_TIMEOUT_S = 300


def adopt_slurm(environ=None) -> bool:
    """Under srun (the launcher set ``STUDY_RANKS_FROM=slurm``): set torch's variables
    from this task's SLURM ones, before anything reads them. True when it did."""
    env = os.environ if environ is None else environ
    if env.get("STUDY_RANKS_FROM") != "slurm" or "SLURM_PROCID" not in env:
        return False
    size = int(env["SLURM_NTASKS"])
    per_node = env.get("SLURM_NTASKS_PER_NODE", "").split("(")[0]
    if not per_node.isdigit():
        per_node = str(size // max(1, int(env.get("SLURM_NNODES", "1"))))
    env["RANK"] = env["SLURM_PROCID"]
    env["WORLD_SIZE"] = str(size)
    env["LOCAL_RANK"] = env.get("SLURM_LOCALID", "0")
    env["LOCAL_WORLD_SIZE"] = per_node
    env["GROUP_RANK"] = env.get("SLURM_NODEID", "0")
    return True


def adopt_mpi(environ=None) -> bool:
    """Under mpirun (launcher accelerate set ``STUDY_RANKS_FROM=mpi``): set torch's
    variables from the MPI process manager's (Intel MPI's ``PMI_RANK``, ``PMI_SIZE``,
    ``MPI_LOCALRANKID``, ``MPI_LOCALNRANKS``; Open MPI's ``OMPI_COMM_WORLD_*``), the
    ones Accelerate reads, before the rank pins itself. True when it did."""
    env = os.environ if environ is None else environ
    if env.get("STUDY_RANKS_FROM") != "mpi":
        return False
    names = {
        "RANK": ("PMI_RANK", "OMPI_COMM_WORLD_RANK"),
        "WORLD_SIZE": ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE"),
        "LOCAL_RANK": ("MPI_LOCALRANKID", "OMPI_COMM_WORLD_LOCAL_RANK"),
        "LOCAL_WORLD_SIZE": ("MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE"),
    }
    found = {
        ours: next((env[m] for m in theirs if m in env), None) for ours, theirs in names.items()
    }
    if found["RANK"] is None or found["WORLD_SIZE"] is None:
        return False
    found["LOCAL_RANK"] = found["LOCAL_RANK"] or found["RANK"]
    found["LOCAL_WORLD_SIZE"] = found["LOCAL_WORLD_SIZE"] or found["WORLD_SIZE"]
    env.update(found)
    return True


def world() -> tuple[int, int, int]:
    """(rank, world size, local rank) from the launcher's variables; (0, 1, 0) alone."""
    rank = int(os.environ.get("RANK", "0"))
    size = int(os.environ.get("WORLD_SIZE", "1"))
    local = int(os.environ.get("LOCAL_RANK", str(rank)))
    return rank, size, local


def rank_cpus(
    spec: dict, local_rank: int, local_size: int, allowed: list[int], topo: dict | None = None
) -> list[int]:
    """The CPUs of rank ``local_rank`` of ``local_size`` on this machine: its block of the
    spec's CPU list (or of ``allowed``), ``threads`` of them, or an even share, placed
    on the machine's topology (``topo``: :func:`sysinfo.cpu_topology`; see
    :func:`rank_blocks`)."""
    cpus = parse_cpu_list(spec["cpus"]) if spec.get("cpus") else sorted(allowed)
    per_rank = spec.get("threads") or len(cpus) // local_size
    if per_rank < 1 or per_rank * local_size > len(cpus):
        need = (
            f"{local_size} ranks x {per_rank} threads" if per_rank >= 1 else f"{local_size} ranks"
        )
        raise ValueError(
            f"{need} need {local_size * max(per_rank, 1)} CPUs, but the trial has "
            f"{len(cpus)} ({','.join(map(str, cpus))})"
        )
    return rank_blocks(cpus, local_size, per_rank, topo or {})[local_rank]


def _cores(cpus: list[int], topo: dict) -> list[list[int]]:
    """The physical cores of ``cpus`` (each a list of its logical CPUs, siblings), in NUMA
    node order, then by their first CPU."""
    by_core: dict[tuple, list[int]] = {}
    for cpu in cpus:
        node, package, core = topo[cpu]
        by_core.setdefault((node, package, core), []).append(cpu)
    return sorted((sorted(c) for c in by_core.values()), key=lambda c: (topo[c[0]][0], c[0]))


def rank_blocks(cpus: list[int], ranks: int, per_rank: int, topo: dict) -> list[list[int]]:
    """Cut ``cpus`` into ``ranks`` blocks of ``per_rank`` CPUs, topology first:

    * whole physical cores per rank (a core's SMT siblings never go to two ranks), and
      one thread per physical core before any sibling: a rank gets ``per_rank`` cores
      when there are enough, else an equal share of the cores (at least enough to hold
      ``per_rank`` threads on their siblings);
    * a rank's cores within one NUMA node where its block fits in what the node has
      left, the remaining ranks on the cores left over;
    * without topology (or a CPU the topology does not know, or more ranks than the
      cores can hold): consecutive blocks of the CPUs in sibling order.
    Without SMT on one node this is the list cut into consecutive blocks."""
    cpus = sorted(cpus)
    if not topo or any(c not in topo for c in cpus):
        return [cpus[r * per_rank : (r + 1) * per_rank] for r in range(ranks)]
    cores = _cores(cpus, topo)
    smt = max(len(c) for c in cores)
    if ranks * per_rank <= len(cores):
        need = per_rank  # a physical core per thread
    else:  # siblings too: spread over every core, so that few cores run two threads
        need = max(-(-per_rank // smt), len(cores) // ranks)
    if ranks * need > len(cores):
        flat = [cpu for core in cores for cpu in core]
        return [sorted(flat[r * per_rank : (r + 1) * per_rank]) for r in range(ranks)]
    # whole blocks of `need` cores inside each NUMA node first, then the leftovers
    nodes: dict[int, list[list[int]]] = {}
    for core in cores:
        nodes.setdefault(topo[core[0]][0], []).append(core)
    blocks, left = [], []
    for node_cores in nodes.values():
        fit = len(node_cores) // need
        blocks += [node_cores[b * need : (b + 1) * need] for b in range(fit)]
        left += node_cores[fit * need :]
    blocks += [left[b * need : (b + 1) * need] for b in range(len(left) // need)]
    out = []
    for block in blocks[:ranks]:
        # first siblings of every core, then second siblings, ...
        order = [core[i] for i in range(smt) for core in block if i < len(core)]
        if len(order) < per_rank:  # uneven cores: fall back to plain blocks
            flat = [cpu for core in cores for cpu in core]
            return [sorted(flat[r * per_rank : (r + 1) * per_rank]) for r in range(ranks)]
        out.append(sorted(order[:per_rank]))
    return out


def placement(cpus: list[int], topo: dict) -> dict:
    """Where a rank's CPUs are: their physical cores (``package:core``), NUMA nodes, and
    how many of its cores it runs on more than one sibling of (for the record)."""
    if not cpus or any(c not in topo for c in cpus):
        return {"cores": None, "numa_nodes": None, "cores_with_two_threads": None}
    cores: dict[str, int] = {}
    for cpu in cpus:
        _, package, core = topo[cpu]
        key = f"{package}:{core}"
        cores[key] = cores.get(key, 0) + 1
    return {
        "cores": sorted(cores),
        "numa_nodes": sorted({topo[c][0] for c in cpus}),
        "cores_with_two_threads": sum(1 for n in cores.values() if n > 1),
    }


def pin(spec: dict) -> list[int] | None:
    """Pin this rank to its CPUs (before torch starts threads); None for one process
    without a CPU list (it keeps what it was given), or when the spec says ``pin: false``."""
    if spec.get(experiment.PIN_KEY) is False:  # a collectives spec's: more ranks than CPUs
        return None
    _, _, local = world()
    local_size = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("WORLD_SIZE", "1")))
    if local_size == 1:
        if spec.get("cpus"):
            cpus = parse_cpu_list(spec["cpus"])  # one process: the whole list, as given
        elif spec.get("comm_cpu"):
            cpus = sorted(os.sched_getaffinity(0))
        else:
            return None
    else:
        allowed, topo = sorted(os.sched_getaffinity(0)), sysinfo.cpu_topology()
        cpus = rank_cpus(spec, local, local_size, allowed, topo)
        workers = worker_affinity(spec, local_size, allowed, topo)
        if workers:
            os.environ[COMM_CPU_VAR] = workers
    if spec.get("comm_cpu"):
        cpus, comm = reserve_comm_cpu(cpus)
        os.environ[RESERVED_VAR] = str(comm)
        if local_size == 1:
            os.environ[COMM_CPU_VAR] = str(comm)
    os.sched_setaffinity(0, cpus)
    return cpus


def worker_affinity(spec: dict, local_size: int, allowed: list[int], topo: dict) -> str | None:
    """``CCL_WORKER_AFFINITY`` for the ranks of one node: oneCCL reads it as the list of
    every local rank's worker CPU, in local-rank order (a single value with 2 local
    ranks: "failed to parse worker affinity"), so each rank computes every block. A
    reserved ``comm_cpu`` holds its rank's worker; with the worker on and none reserved,
    it runs on its block's last CPU. None: oneCCL's worker is off (or not oneCCL)."""
    if spec.get("dist_backend") != "ccl":
        return None
    if not (spec.get("comm_cpu") or spec.get("ccl_worker_offload")):
        return None
    blocks = [rank_cpus(spec, r, local_size, allowed, topo) for r in range(local_size)]
    if spec.get("comm_cpu"):
        return ",".join(str(reserve_comm_cpu(b)[1]) for b in blocks)
    return ",".join(str(max(b)) for b in blocks)


#: where oneCCL pins its worker threads (one CPU per worker of each local rank, in
#: local-rank order; the study runs one worker a rank)
COMM_CPU_VAR = "CCL_WORKER_AFFINITY"
#: this rank's own reserved CPU (comm_cpu), for its record
RESERVED_VAR = "STUDY_COMM_CPU"


def reserve_comm_cpu(cpus: list[int]) -> tuple[list[int], int]:
    """A rank's block split for ``comm_cpu``: (the CPUs torch's threads run on, the CPU
    oneCCL's worker thread is pinned to). The reserved one is the block's last: a whole
    core's second hyperthread where the block has siblings (rank_blocks puts them last),
    so the compute keeps its physical cores."""
    if len(cpus) < 2:
        raise ValueError(f"comm_cpu needs 2 CPUs or more per rank (got {cpus})")
    return cpus[:-1], cpus[-1]


def pg_timeout_s(spec: dict) -> int:
    return max(10, min(int(spec["timeout_s"]), MAX_PG_TIMEOUT_S))


def init_process_group(spec: dict) -> dict:
    """Join the trial's process group with the spec's backend (registering ``ccl``
    first); return what was set up, for the record's checks."""
    import torch.distributed as dist

    how = config = None
    timeout = datetime.timedelta(seconds=pg_timeout_s(spec))
    if spec["dist_backend"] == "ccl":
        from . import ccl

        how = ccl.register(spec["ccl_impl"])
        # oneCCL opens its transports here and names the providers only in its log
        with ccl.ccl_output() as output:
            dist.init_process_group(backend="ccl", timeout=timeout)
        config = {**ccl.effective_config(), "ofi": ccl.read_providers(output["text"])}
    else:
        dist.init_process_group(backend=spec["dist_backend"], timeout=timeout)
    return {
        "dist_backend": dist.get_backend(),
        "world_size": dist.get_world_size(),
        "pg_timeout_s": timeout.total_seconds(),
        "ccl": how,
        "ccl_config": config,
        "address": bound_address(),
    }


def bound_address() -> dict:
    """Where this rank's process group talks from: its host name and the address it
    resolves to (Gloo binds there unless ``GLOO_SOCKET_IFNAME`` names an interface; a
    Debian-style host maps its own name to 127.0.1.1, which peers on other nodes cannot
    reach), the rendezvous address, and the interfaces the study named."""
    import socket

    host = socket.gethostname()
    try:
        resolved = socket.gethostbyname(host)
    except OSError as exc:
        resolved = f"unresolved: {exc}"
    names = ("MASTER_ADDR", "GLOO_SOCKET_IFNAME", "CCL_KVS_IFACE", "FI_TCP_IFACE")
    return {"hostname": host, "resolves_to": resolved,
            **{k: os.environ[k] for k in names if k in os.environ}}  # fmt: skip


def barrier() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def agree(flag: bool) -> bool:
    """True when any rank says so (one decision for all ranks, e.g. to stop early)."""
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return flag
    t = torch.tensor([1 if flag else 0], dtype=torch.int64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())


def shutdown() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
