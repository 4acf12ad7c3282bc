"""What was really in force for a run: CPU, topology, threads, affinity, env, libraries.

Standard library only: it runs inside every backend environment and in the
workflow's own environment (for records of runs that crashed before reporting).
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import os
import platform
import re
import socket
import subprocess
import sys
from pathlib import Path

# ISA flags that decide which CPU kernels PyTorch/oneDNN can use.
DL_FLAGS = (
    "avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni",
    "avx512_bf16", "avx512_fp16", "avx_vnni", "amx_tile", "amx_bf16", "amx_int8",
)  # fmt: skip

# Environment variables that change how a training step runs on a CPU.
ENV_VARS = (
    "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OMP_PROC_BIND", "OMP_PLACES", "GOMP_CPU_AFFINITY",
    "KMP_AFFINITY", "KMP_BLOCKTIME", "KMP_SETTINGS", "LD_PRELOAD", "MALLOC_CONF",
    "DNNL_MAX_CPU_ISA", "ONEDNN_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY", "TORCHINDUCTOR_CACHE_DIR",
    "TRITON_CACHE_DIR", "TORCHINDUCTOR_FREEZING", "PJRT_DEVICE", "XLA_FLAGS", "XLA_USE_BF16",
    "CCL_WORKER_COUNT", "VIRTUAL_ENV", "CUDA_VISIBLE_DEVICES",
)  # fmt: skip

# Shared libraries whose presence in the process tells the runtime in force.
MAPPED_LIBS = ("libtcmalloc", "libjemalloc", "libiomp5", "libgomp")


def thread_cpus(task_root: str = "/proc/self/task") -> list[dict]:
    """Every thread of this process: its name and the CPUs it may run on (from /proc),
    e.g. to see where a library pinned its own threads."""
    threads = []
    for task in sorted(Path(task_root).iterdir(), key=lambda p: int(p.name)):
        try:
            name = (task / "comm").read_text().strip()
            status = (task / "status").read_text()
        except OSError:  # a thread that ended meanwhile
            continue
        allowed = next(
            (line.split(":", 1)[1].strip() for line in status.splitlines()
             if line.startswith("Cpus_allowed_list:")), ""
        )  # fmt: skip
        threads.append({"tid": int(task.name), "name": name, "cpus": allowed})
    return threads


def cpu_list_str(cpus) -> str:
    """Compact form of a CPU set: {0,1,2,5} -> '0-2,5'."""
    cpus = sorted(cpus)
    parts: list[str] = []
    start = prev = None
    for c in cpus:
        if start is None:
            start = prev = c
        elif c == prev + 1:
            prev = c
        else:
            parts.append(f"{start}-{prev}" if start != prev else f"{start}")
            start = prev = c
    if start is not None:
        parts.append(f"{start}-{prev}" if start != prev else f"{start}")
    return ",".join(parts)


def allowed_cpus() -> list[int]:
    """The CPUs this process may run on (its affinity mask), sorted."""
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return list(range(os.cpu_count() or 1))


#: the CPUs the invoking Snakemake planned the study on, inherited by its jobs
PLAN_CPUS_VAR = "STUDY_PLAN_CPUS"


def plan_cpus() -> list[int]:
    """The CPUs a study is planned on (layouts, CPU checks, what a measured cluster job
    asks for): this machine's (:func:`allowed_cpus`), or, in a job's process, those of
    the invocation that planned it (``STUDY_PLAN_CPUS``), so that every job expands the
    study to the same experiments, also on a cluster node that differs."""
    inherited = os.environ.get(PLAN_CPUS_VAR)
    if inherited:
        try:
            return parse_cpu_list(inherited)
        except ValueError:
            pass
    return allowed_cpus()


#: CPU numbers a list may name: Linux numbers at most NR_CPUS (8192 with MAXSMP on
#: x86-64, 4096 on most distributions' kernels); far beyond, a list is a mistake, and
#: expanding it would cost memory before any check could say so
MAX_CPU = 65535


def parse_cpu_list(text: str) -> list[int]:
    """``'0-2,5'`` -> ``[0, 1, 2, 5]`` (sorted, each CPU once); ValueError when an item
    is not a CPU number or an a-b range with a <= b, or names a CPU beyond
    :data:`MAX_CPU` (the list is bounded before it is expanded)."""
    out: set[int] = set()
    if len(text) > 8 * (MAX_CPU + 1):
        raise ValueError(f"a CPU list of {len(text)} characters is longer than any machine's")
    for part in text.split(","):
        m = re.fullmatch(r"\s*(\d{1,9})(?:-(\d{1,9}))?\s*", part)
        if not m:
            raise ValueError(f"{part[:40]!r} is not a CPU number or an a-b range")
        a = int(m.group(1))
        b = int(m.group(2)) if m.group(2) is not None else a
        if a > b:
            raise ValueError(f"range {part!r} runs backwards")
        if b > MAX_CPU:
            raise ValueError(f"CPU {b} is beyond any machine's (at most {MAX_CPU})")
        out.update(range(a, b + 1))
    return sorted(out)


CPU_SYSFS = Path("/sys/devices/system/cpu")
NODE_SYSFS = Path("/sys/devices/system/node")


def cpu_topology(cpu_root: Path = CPU_SYSFS, node_root: Path = NODE_SYSFS) -> dict[int, tuple]:
    """Each logical CPU's place, read from sysfs: ``{cpu: (NUMA node, package, core)}``.
    Logical CPUs with the same package and core are SMT siblings (hyperthreads of one
    physical core). A CPU without a readable ``topology`` folder is left out; without
    NUMA information every CPU is on node 0. Empty when nothing is readable."""
    node_of: dict[int, int] = {}
    for node in sorted(Path(node_root).glob("node[0-9]*")):
        try:
            cpus = parse_cpu_list((node / "cpulist").read_text().strip() or "")
        except (OSError, ValueError):
            continue
        for cpu in cpus:
            node_of[cpu] = int(node.name[4:])
    topo: dict[int, tuple] = {}
    for folder in Path(cpu_root).glob("cpu[0-9]*"):
        cpu = int(folder.name[3:])
        try:
            package = int((folder / "topology" / "physical_package_id").read_text())
            core = int((folder / "topology" / "core_id").read_text())
        except (OSError, ValueError):
            continue
        topo[cpu] = (node_of.get(cpu, 0), package, core)
    return topo


def _cpuinfo() -> dict[str, str]:
    info: dict[str, str] = {}
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return info
    for line in text.splitlines():
        if not line.strip():
            break  # first processor is enough
        key, _, value = line.partition(":")
        info[key.strip()] = value.strip()
    return info


def topology() -> dict:
    info = _cpuinfo()
    flags = set(info.get("flags", "").split())
    cores = set()
    base = Path("/sys/devices/system/cpu")
    for topo in base.glob("cpu[0-9]*/topology"):
        try:
            pkg = (topo / "physical_package_id").read_text().strip()
            core = (topo / "core_id").read_text().strip()
            cores.add((pkg, core))
        except OSError:
            pass
    nodes = list(Path("/sys/devices/system/node").glob("node[0-9]*"))
    return {
        "cpu_model": info.get("model name") or platform.processor() or "unknown",
        "cpu_vendor": info.get("vendor_id"),
        # a bare model name ("AMD EPYC" in some VMs) still has these: family 25 model 17
        # is Zen 4 (Genoa), family 6 model 143 Sapphire Rapids
        "cpu_family": info.get("cpu family"),
        "cpu_model_number": info.get("model"),
        "cpu_stepping": info.get("stepping"),
        "cpu_flags": [f for f in DL_FLAGS if f in flags],
        "logical_cpus": os.cpu_count(),
        "physical_cores": len(cores) or None,
        "numa_nodes": len(nodes) or 1,
    }


def node_type(prov: dict | None = None) -> str:
    """A machine's kind, as far as a measurement is concerned: its CPU model and how many
    logical CPUs it has (this machine's, or those of a record's provenance)."""
    prov = topology() if prov is None else prov
    model = " ".join(str(prov.get("cpu_model") or "unknown CPU").split())
    return f"{model} ({prov.get('logical_cpus') or '?'} CPUs)"


def mapped_libraries() -> list[str]:
    """Allocator/OpenMP libraries mapped into this process (what LD_PRELOAD really did)."""
    found: list[str] = []
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return found
    for line in maps.splitlines():
        path = line.split()[-1] if line.split() else ""
        name = os.path.basename(path)
        if any(name.startswith(prefix) for prefix in MAPPED_LIBS) and path not in found:
            found.append(path)
    return found


def openmp_runtime(libs: list[str]) -> str | None:
    names = [os.path.basename(p) for p in libs]
    if any(n.startswith("libiomp5") for n in names):
        return "intel-openmp"
    if any(n.startswith("libgomp") for n in names):
        return "gnu-openmp"
    return None


def git_revision(repo: str | os.PathLike | None = None) -> tuple[str | None, bool | None]:
    repo = repo or Path(__file__).resolve().parent.parent
    try:
        rev = subprocess.run(
            ["git", "-C", str(repo), "rev-parse", "HEAD"],
            capture_output=True, text=True, timeout=10, check=True,
        ).stdout.strip()  # fmt: skip
        dirty = subprocess.run(
            ["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True, text=True, timeout=10, check=True,
        ).stdout.strip()  # fmt: skip
        return rev, bool(dirty)
    except (OSError, subprocess.SubprocessError):
        return os.environ.get("STUDY_GIT_REVISION"), None


def now(timespec: str = "seconds") -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec=timespec)


def collect(extra_env_vars: tuple[str, ...] = ()) -> dict:
    """Provenance of the calling process (no torch needed)."""
    prov = topology()
    try:
        affinity = sorted(os.sched_getaffinity(0))
    except AttributeError:
        affinity = list(range(os.cpu_count() or 1))
    libs = mapped_libraries()
    rev, dirty = git_revision()
    prov.update(
        {
            "affinity": cpu_list_str(affinity),
            "affinity_count": len(affinity),
            "env": {k: os.environ.get(k) for k in ENV_VARS + tuple(extra_env_vars)},
            "ld_preload": [p for p in libs if not os.path.basename(p).startswith("libgomp")],
            "mapped_libs": libs,
            "openmp_runtime": openmp_runtime(libs),
            "python_version": platform.python_version(),
            "hostname": socket.gethostname(),
            "kernel": platform.release(),
            "git_revision": rev,
            "git_dirty": dirty,
            "load_avg": list(os.getloadavg()),
            "pid": os.getpid(),
        }
    )
    return prov


#: libraries besides torch whose versions every record holds (module -> key): the
#: transformer workloads' models and the accelerate launcher's library
LIBRARIES = {
    "torchvision": "torchvision",
    "transformers": "transformers",
    "accelerate": "accelerate",
}


def torch_info() -> dict:
    """Versions and threading of the torch stack in this process (imports torch)."""
    import importlib

    import torch

    versions = {"python": platform.python_version(), "torch": torch.__version__}
    from . import backends

    modules = {**LIBRARIES, **backends.version_modules(), "numpy": "numpy"}
    for mod, key in modules.items():
        m = sys.modules.get(mod)
        if m is None:
            try:
                spec = importlib.util.find_spec(mod)
            except (ImportError, ValueError):
                spec = None
            versions[key] = _dist_version(mod) if spec else None
        else:
            versions[key] = getattr(m, "__version__", None)
    parallel = torch.__config__.parallel_info()
    m = re.search(r"ATen parallel backend: (.*)", parallel)
    return {
        "versions": versions,
        "torch_num_threads": torch.get_num_threads(),
        "torch_interop_threads": torch.get_num_interop_threads(),
        "aten_parallel_backend": m.group(1).strip() if m else None,
        "mkldnn_enabled": bool(torch.backends.mkldnn.is_available()),
        "cpu_capability": _cpu_capability(torch),
    }


def _cpu_capability(torch) -> str | None:
    try:
        return torch.backends.cpu.get_cpu_capability()
    except Exception:  # older torch
        return None


def _dist_version(module: str) -> str | None:
    """The version of the distribution that provides ``module``: the distribution of the
    module's own name first (one metadata file read), the index of every installed
    distribution's files only where none is so named (building that index costs 0.1 s
    in a backend environment, and every rank process ends with this lookup)."""
    from importlib import metadata

    with contextlib.suppress(metadata.PackageNotFoundError):
        return metadata.version(module)
    try:
        dists = metadata.packages_distributions().get(module)
        return metadata.version(dists[0]) if dists else None
    except metadata.PackageNotFoundError:
        return None


# ---- inside a SLURM job (the cluster profile's): which job, which nodes. The executor
# plugin's job step keeps only the job's identity (SLURM_JOB_ID, SLURM_CLUSTER_NAME,
# SLURM_SUBMIT_*) in what it runs; a single-process job additionally runs as a one-task
# step (srun -n1) with that step's variables.
#: the variables a record keeps (those present), by their names in the record
SLURM_RECORDED = {
    "job_id": "SLURM_JOB_ID",
    "cluster": "SLURM_CLUSTER_NAME",
    "partition": "SLURM_JOB_PARTITION",
    "step_id": "SLURM_STEP_ID",
    "job_nodelist": "SLURM_JOB_NODELIST",
    "cpus_on_node": "SLURM_CPUS_ON_NODE",
    "submit_host": "SLURM_SUBMIT_HOST",
}


def proc_stat(pid: int) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after the command's name (``[0]`` the state,
    ``[1]`` the parent, ``[19]`` the start time in clock ticks since boot), None when
    the process is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields if len(fields) > 19 else None


def start_time(pid: int) -> str | None:
    """A process's start time (clock ticks since boot; with its PID, the process: a
    reused PID is not the same one), None when it is gone."""
    fields = proc_stat(pid)
    return fields[19] if fields else None


def slurm_job(environ: dict | None = None) -> dict | None:
    """The SLURM job this process runs in (None outside one)."""
    env = os.environ if environ is None else environ
    if not env.get("SLURM_JOB_ID"):
        return None
    return {key: env[var] for key, var in SLURM_RECORDED.items() if env.get(var)}
