"""Data-parallel ranks: ``nodes`` x ``ranks`` processes, each pinned to its own block
of its node's CPUs, joined in a process group of the spec's ``dist_backend`` (gloo, or
ccl on oneCCL) and training one DDP model on an even share of the global batch. The
slowest rank decides each step.

Who starts the ranks: ``torchrun`` (``python -m torch.distributed.run``) on this
machine; inside a SLURM job of the cluster profile (local environments), ``srun``,
one task per rank, possibly on several nodes (each rank takes its ``RANK``,
``WORLD_SIZE`` and ``LOCAL_RANK`` from SLURM's ``SLURM_PROCID``, ``SLURM_NTASKS`` and
``SLURM_LOCALID``, and meets rank 0 at this host, where the job's batch step runs).

The ranks' results are merged into the trial's: per timed step the slowest rank's
time, every rank's own step times (``rank_step_times_s``), their summed memory, and
the most disturbed rank's noise probe.
"""

from __future__ import annotations

import os
from pathlib import Path

from .. import backends, metrics, sysinfo
from ..util import finite
from .base import ENTRY, Launcher, nodes

#: process-group backend -> (environment, image) it needs instead of the backend's own
DIST_ENVS = {"ccl": ("oneccl", "oneccl")}
#: the environments the ccl backend can be added to (oneccl is upstream + oneCCL)
CCL_BASE_ENV = "upstream"


class Torchrun(Launcher):
    name = "torchrun"
    order = 20
    distributed = True
    layouts = True
    owns = {
        "ranks": 1,
        "nodes": 1,
        "dist_backend": "gloo",
        "ccl_impl": "study",
        "ccl_transport": "shm",
        "ccl_worker_offload": False,
        "comm_cpu": False,
    }
    envs = {env for env, _ in DIST_ENVS.values()}
    # oneCCL's image: the inductor image (upstream PyTorch) plus the oneccl lock
    images = {"oneccl": ("inductor", "oneccl")}
    # the study's own ccl process group, compiled against the lock's oneCCL
    extensions = {
        "ccl": (
            "oneccl-cpu-devel==",
            "containers/oneccl/build_ccl.py",
            ("containers/oneccl/ccl_backend.cpp", "containers/oneccl/build_ccl.py"),
            "lib/study-ccl",
        ),
    }

    def check(self, spec: dict) -> list[str]:
        problems = []
        backend = backends.get(spec["backend"])
        if not backend.ddp:
            able = ", ".join(b.name for b in backends.all_backends() if b.ddp)
            problems.append(
                "launcher 'torchrun' trains with DistributedDataParallel on CPU tensors; "
                f"backend {backend.name!r} is not supported (use {able})"
            )
        problems += self.split_problems(spec)
        if spec["dist_backend"] == "ccl" and backend.env != CCL_BASE_ENV:
            able = " or ".join(repr(b.name) for b in backends.all_backends()
                               if b.env == CCL_BASE_ENV)  # fmt: skip
            problems.append(
                f"dist_backend 'ccl' runs in the oneccl environment (upstream PyTorch + "
                f"oneCCL): backend {able} (got backend {spec['backend']!r})"
            )
        return problems + self.ccl_knob_problems(spec)

    def split_problems(self, spec: dict) -> list[str]:
        """The global batch must split evenly over the world."""
        world = self.ranks(spec)
        if not spec["batch_size"] % world:
            return []
        over = f"ranks {spec['ranks']}"
        if nodes(spec) > 1:
            over = f"nodes {spec['nodes']} x ranks {spec['ranks']} = {world} processes"
        return [
            f"batch_size {spec['batch_size']} (the global batch) does not split evenly "
            f"over {over}; use a multiple of {world}"
        ]

    def ccl_knob_problems(self, spec: dict) -> list[str]:
        """oneCCL's knobs away from their neutral values need the ccl process group."""
        if spec["dist_backend"] != "ccl":
            return [
                f"{knob} {spec[knob]!r} needs dist_backend 'ccl' "
                f"(got dist_backend {spec['dist_backend']!r})"
                for knob in ("ccl_impl", "ccl_transport", "ccl_worker_offload", "comm_cpu")
                if spec[knob] != self.owns[knob]
            ]
        problems = []
        if spec["comm_cpu"] and not spec["ccl_worker_offload"]:
            problems.append(
                "comm_cpu true reserves a CPU for oneCCL's worker thread: it needs "
                "ccl_worker_offload true (without the worker, communication runs on the "
                "rank's own threads)"
            )
        if spec["comm_cpu"] and self.threads_per_rank(spec) < 2:
            problems.append(
                f"comm_cpu true needs threads >= 2 per rank (one for communication, the "
                f"rest for torch; got {self.threads_per_rank(spec)})"
            )
        return problems

    def ranks(self, spec: dict) -> int:
        """The world: ``nodes`` x ``ranks`` (per node) processes."""
        return int(spec["ranks"]) * nodes(spec)

    def env(self, spec: dict, backend) -> str:
        return DIST_ENVS.get(spec["dist_backend"], (backend.env, None))[0]

    def image(self, spec: dict, backend) -> str:
        return DIST_ENVS.get(spec["dist_backend"], (None, backend.image))[1]

    def command(
        self,
        spec: dict,
        python: str,
        harness_args: list[str],
        program: Path = ENTRY,
        starter: str = "local",
    ) -> list[str]:
        rank = self.rank_command(spec, python, harness_args, program)
        if starter == "srun":
            return self.srun_command(spec, rank)
        return [
            python, "-u", "-m", "torch.distributed.run",
            "--standalone", "--nnodes=1", f"--nproc-per-node={spec['ranks']}",
            "--max-restarts=0", *rank[2:],
        ]  # fmt: skip

    def srun_command(self, spec: dict, rank: list[str]) -> list[str]:
        """srun, one task per rank, inside the job's allocation. No binding by SLURM:
        each rank pins itself to its block of its node's CPUs, as under torchrun; a
        failed rank ends the others (--kill-on-bad-exit)."""
        return [
            "srun", f"--nodes={spec['nodes']}", f"--ntasks={self.ranks(spec)}",
            f"--ntasks-per-node={spec['ranks']}",
            f"--cpus-per-task={self.threads_per_rank(spec)}", "--cpu-bind=none",
            "--kill-on-bad-exit=1", "--unbuffered", "--label", *rank,
        ]  # fmt: skip

    def threads_per_rank(self, spec: dict) -> int:
        if spec.get("threads"):
            return int(spec["threads"])
        cpus = sysinfo.parse_cpu_list(spec["cpus"]) if spec.get("cpus") else os.sched_getaffinity(0)
        return max(1, len(cpus) // int(spec["ranks"]))

    def compute_threads(self, spec: dict) -> int:
        """torch's threads per rank: its block, less the CPU comm_cpu reserves."""
        return self.threads_per_rank(spec) - (1 if spec.get("comm_cpu") else 0)

    def environment(self, spec: dict, starter: str = "local") -> dict[str, str]:
        # torchrun sets OMP_NUM_THREADS=1 where it is unset: always set it
        env = {"OMP_NUM_THREADS": str(self.compute_threads(spec))}
        if starter == "srun":
            env.update(srun_rendezvous(spec))
        if spec["dist_backend"] == "ccl":
            env["CCL_WORKER_OFFLOAD"] = "1" if spec["ccl_worker_offload"] else "0"
            env["CCL_ATL_TRANSPORT"] = "ofi"
            one_host = nodes(spec) == 1
            # the ranks share this host: oneCCL's bootstrap (and ofi's tcp provider) on
            # loopback, which by default it skips ("can't find interface to get host
            # IP" in a container without a network); across nodes, the interface set
            # (srun_rendezvous), else oneCCL's own choice
            if one_host:
                env["CCL_KVS_IFACE"] = "lo"
            if spec["ccl_transport"] == "shm":
                env["CCL_ATL_SHM"] = "1"
                # shm between the ranks of a node, and between the nodes the provider
                # the study names: libfabric's own first choice can be shm itself
                # (oneCCL 2021.14 took it on a TCP-only network), which cannot reach
                # another machine; oneCCL adds shm to FI_PROVIDER for the node's ranks
                provider = os.environ.get(FABRIC_PROVIDER_VAR, DEFAULT_FABRIC_PROVIDER)
                if not one_host and provider:
                    env["FI_PROVIDER"] = provider
            else:
                env["CCL_ATL_SHM"] = "0"
                env["FI_PROVIDER"] = "tcp"
                if one_host:
                    env["FI_TCP_IFACE"] = "lo"
        return env

    def merge(self, results: list[dict]) -> dict:
        """One record from the ranks' results: a failed rank fails the trial (the first
        one's error, naming its rank); else the slowest rank decides each step."""
        bad = [(r, res) for r, res in enumerate(results) if res.get("status") != "ok"]
        # a rank's own failure first; the ranks the launcher stopped after it last
        for r, res in sorted(bad, key=lambda rr: rr[1].get("status") == "stopped"):
            merged = dict(res)
            error = dict(res.get("error") or {"type": "Stopped", "message": "stopped"})
            error["message"] = f"rank {r}: {error.get('message', '')}"
            merged["error"] = error
            # a rank's own verdict on its step stands (incorrect); anything else failed
            merged["status"] = "incorrect" if res.get("status") == "incorrect" else "failed"
            merged["rank_status"] = [x.get("status") for x in results]
            return merged
        return merge_ok(results)


#: the network interface several-node ranks talk over (the ``cluster`` setting's
#: ``network_interface``, set by the study's loader for every job's process)
NETWORK_INTERFACE_VAR = "STUDY_NETWORK_INTERFACE"
#: the libfabric provider oneCCL's several-node ranks use between their nodes (the
#: ``cluster`` setting's ``fabric_provider``, set likewise; empty: libfabric's choice)
FABRIC_PROVIDER_VAR = "STUDY_FABRIC_PROVIDER"
DEFAULT_FABRIC_PROVIDER = "tcp"


def srun_rendezvous(spec: dict) -> dict[str, str]:
    """Where srun's ranks meet: rank 0 runs on this host (the job's first node, where
    its batch step runs), on a free port of it; loopback when all ranks are here.
    Across nodes, with a network interface set, its address here, and Gloo and oneCCL
    (its bootstrap and ofi's tcp provider) on that interface; without one, this host's
    name, and each library's own choice of interface."""
    import socket

    env = {"STUDY_RANKS_FROM": "slurm", "MASTER_PORT": str(free_port())}
    if nodes(spec) == 1:
        return {**env, "MASTER_ADDR": "127.0.0.1"}
    iface = os.environ.get(NETWORK_INTERFACE_VAR)
    if not iface:
        return {**env, "MASTER_ADDR": socket.gethostname()}
    env.update(GLOO_SOCKET_IFNAME=iface, CCL_KVS_IFACE=iface, FI_TCP_IFACE=iface)
    return {**env, "MASTER_ADDR": interface_address(iface) or socket.gethostname()}


def interface_address(name: str) -> str | None:
    """The IPv4 address of network interface ``name`` on this host (None: no such
    interface, or none of its addresses is IPv4)."""
    import fcntl
    import socket
    import struct

    siocgifaddr = 0x8915
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            packed = fcntl.ioctl(s.fileno(), siocgifaddr, struct.pack("256s", name[:15].encode()))
        except OSError:
            return None
    return socket.inet_ntoa(packed[20:24])


#: the ports a rendezvous port is drawn from, less the kernel's ephemeral range
RENDEZVOUS_PORTS = range(10000, 65536)
#: ip_local_port_range's default, where /proc does not say
EPHEMERAL_DEFAULT = (32768, 60999)


def ephemeral_ports() -> range:
    """The ports the kernel hands to a socket bound to port 0 or an outgoing
    connection (``net.ipv4.ip_local_port_range``)."""
    try:
        low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        low, high = EPHEMERAL_DEFAULT
    return range(low, high + 1)


def free_port(tries: int = 200) -> int:
    """A TCP port free on this host now, for the ranks' rendezvous: rank 0's store
    listens on it seconds later. Drawn at random from outside the kernel's ephemeral
    range: a port of that range, free now, is the kernel's to hand to any socket bound
    to port 0 in between (srun's and mpirun's own listeners, which start right after,
    or any connection), and rank 0 then fails ("The server socket has failed to listen
    on any local network address"); a port outside it is taken only by a program that
    names it. Any free port where none outside is (after ``tries``)."""
    import random
    import socket

    ephemeral = ephemeral_ports()
    pool = [p for p in RENDEZVOUS_PORTS if p not in ephemeral]
    for port in [*random.sample(pool, min(tries, len(pool))), 0]:
        with socket.socket() as s:
            try:
                s.bind(("", port))
            except OSError:
                continue
            return s.getsockname()[1]
    raise OSError("no free TCP port on this host")


def merge_ok(results: list[dict]) -> dict:
    """The trial's result from N ranks that all finished."""
    first = results[0]
    spec = first["spec"]
    per_rank = [r["step_times_s"] for r in results]
    steps = min(len(t) for t in per_rank)
    slowest = [max(t[i] for t in per_rank) for i in range(steps)]
    losses_per_rank = [r["losses"] for r in results]
    n_loss = min(len(x) for x in losses_per_rank)
    losses = [sum(x[i] for x in losses_per_rank) / len(results) for i in range(n_loss)]
    ms = [r["metrics"] for r in results]
    m = dict(ms[0])
    m["samples_per_s"] = metrics.throughput(spec["batch_size"], slowest)
    m["step_time_s"] = metrics.distribution(slowest)
    m["steps_timed"] = steps
    for key in (
        "time_to_first_step_s",
        "setup_s",
        "import_s",
        "libraries_s",
        "flops_count_s",
        "wall_s",
        "train_time_s",
        "scoring_s",
        "time_to_accuracy_s",
    ):
        values = [x.get(key) for x in ms if finite(x.get(key))]
        m[key] = max(values) if values else m.get(key)
    m["time_budget_hit"] = any(x.get("time_budget_hit") for x in ms)
    m["peak_rss_mb"] = sum(x["peak_rss_mb"] for x in ms)
    m["peak_rss_children_mb"] = sum(x.get("peak_rss_children_mb") or 0 for x in ms)
    m["rank_peak_rss_mb"] = [x["peak_rss_mb"] for x in ms]
    m["rank_samples_per_s"] = [x["samples_per_s"] for x in ms]
    m["first_loss"], m["final_loss"] = losses[0], losses[-1]
    if "test_accuracy" in m:  # every rank scores its (identical) model: rank 0's stands
        m["rank_test_accuracy"] = [x.get("test_accuracy") for x in ms]
    if m.get("accuracy_curve"):  # ... at the training time of the slowest rank
        curves = [x.get("accuracy_curve") or [] for x in ms]
        m["accuracy_curve"] = [
            {**point, "train_time_s": max(c[i]["train_time_s"] for c in curves if len(c) > i)}
            for i, point in enumerate(m["accuracy_curve"])
        ]
    # every rank's work (its share of the ceiling of all their threads: the trial policy's)
    flops = m.get("flops_per_sample")
    m["achieved_gflops"] = flops * m["samples_per_s"] / 1e9 if finite(flops) else None
    probes = [r.get("probe") for r in results]
    merged = dict(first)
    merged["metrics"] = m
    merged["step_times_s"] = slowest
    merged["rank_step_times_s"] = per_rank
    merged["losses"] = losses
    # the most disturbed rank's probes and other work speak for the trial
    merged["probe"] = _slowest_probe(probes)
    merged["rank_probes"] = probes
    merged["probe_after"] = _slowest_probe([r.get("probe_after") for r in results])
    works = [r.get("other_work") for r in results]
    judged = [w for w in works if isinstance(w, dict) and finite(w.get("share"))]
    merged["other_work"] = max(judged, key=lambda w: w["share"]) if judged else works[0]
    merged["rank_other_work"] = works
    checks = dict(first.get("checks") or {})
    checks["rank_cpus"] = [(r.get("checks") or {}).get("cpus") for r in results]
    checks["rank_placement"] = [(r.get("checks") or {}).get("placement") for r in results]
    checks["rank_hosts"] = [(r.get("provenance") or {}).get("hostname") for r in results]
    # where each rank's process group talked from (its host name's address, the
    # rendezvous, the interfaces named): the 127.0.1.1 trap of Debian-style hosts shows
    checks["rank_addresses"] = [(r.get("checks") or {}).get("address") for r in results]
    merged["checks"] = checks
    return merged


def _slowest_probe(probes: list) -> dict | None:
    rated = [p for p in probes if isinstance(p, dict) and finite(p.get("fp32_gflops"))]
    return min(rated, key=lambda p: p["fp32_gflops"]) if rated else (probes or [None])[0]


LAUNCHER = Torchrun()
