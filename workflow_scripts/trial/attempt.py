"""One attempt: the ranks' command lines from the launcher, run as a measured process
(``runtimes.measured``: wrapped by the runtime, with the spec's time limit), and the
record assembled from what came back."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

from .. import launchers, runtimes, sysinfo
from ..launchers import harness_args, result_paths
from ..rank import references
from ..runtimes import warm
from ..runtimes.measured import Process, environment, run_measured
from .environment import absolute_path, compile_cache, run_mounts
from .outcome import assemble, failure, outcome


@dataclasses.dataclass(frozen=True)
class Trial:
    """One trial as its job gives it: the spec, the environment, where its record and
    log go, and what it reads besides. ``attempt``: its job's (Snakemake's retry: 2),
    for an earlier job lost whole; ``first_trial``: a later trial's first trial's
    record, what it carries (carry.py); ``far_baseline``: the record it stops early
    against when far from it (far.py)."""

    spec: dict
    env_info: dict
    out: Path
    log: Path
    index: int = 0
    data_path: str | None = None
    first_trial: Path | None = None
    far_baseline: Path | None = None
    attempt: int = 1


def attempt_once(job: Trial, attempt: int, cache_plan: dict | None = None) -> dict:
    """One run of the trial (its ranks' processes): its record, not yet written.
    ``cache_plan``: where its compile cache comes from (carry.compile_cache_plan)."""
    spec, env_info, out, log, trial = job.spec, job.env_info, job.out, job.log, job.index
    data_path = job.data_path
    runtime = runtimes.for_env(env_info)
    launcher = launchers.get(spec["launcher"])
    container = runtimes.in_container(env_info)
    label = f"{spec['id']}-trial{trial}-{attempt}"
    template, results = result_paths(out, launcher.ranks(spec))
    spec_json = json.dumps(spec, sort_keys=True)
    args = harness_args(spec_json, template, absolute_path(data_path))
    starter = launchers.starter(launcher, spec, runtime.name)
    cmd = launcher.command(spec, env_info["python"], args, starter=starter)
    if starter == "local" and runtime.name == "local" and sysinfo.slurm_job():
        cmd = slurm_step(cmd)
    env = environment(spec, runtime, starter)
    cache, cache_folder = compile_cache(spec, env, label, container, cache_plan)
    missing = runtime.missing()
    why_not = missing or cannot_start(spec, runtime.name)
    if why_not:
        kind = "ImageMissing" if missing else "NeedsCluster"
        record = failure(spec, trial, kind, why_not)
        record["provenance"] = {**sysinfo.collect(), **runtimes.image_provenance(env_info)}
        record["provenance"].update(runtime=runtime.name, compile_cache=cache)
        return record
    cpus = sysinfo.parse_cpu_list(spec["cpus"]) if spec.get("cpus") else None
    started = sysinfo.now()
    offset = log.stat().st_size if log.exists() else 0  # this attempt's output: after it
    try:
        process = Process(
            cmd, env, f"{spec['id']}-t{trial}-a{attempt}",
            mounts=run_mounts(out, data_path, cache, spec.get("weights_from"),
                              references.shares(spec)),
            cpus=cpus,
            warm=warm_start(spec, env_info, runtime.name, cmd),
        )  # fmt: skip
        ran = run_measured(runtime, process, log=log, timeout_s=spec["timeout_s"], results=results)
    finally:
        if cache_folder is not None:
            shutil.rmtree(cache_folder, ignore_errors=True)
            cache["removed"] = not cache_folder.exists()
    record = outcome(spec, launcher, ran, log, offset)
    assemble(record, spec, trial, env_info, runtime.name, ran, started)
    record["provenance"]["compile_cache"] = cache
    return record


def warm_start(
    spec: dict, env_info: dict, runtime: str, cmd: list[str]
) -> tuple[str, tuple[str, ...]] | None:
    """Whether the attempt's process is forked from a warm interpreter (``warm.py``):
    (python, what it imports) for one process of the local runtime started by no
    launcher, outside SLURM, on the CPUs it was given, where ``warm_interpreter`` is on;
    else None (a fresh process)."""
    if not warm.enabled(env_info.get("warm_interpreter", False), runtime):
        return None
    if not warm.candidate(spec) or launchers.get(spec["launcher"]).ranks(spec) != 1:
        return None
    if cmd[:3] != [env_info["python"], "-u", str(launchers.ENTRY)]:
        return None
    return env_info["python"], warm.preload(spec["model"])


def slurm_step(cmd: list[str]) -> list[str]:
    """A single-process run inside a SLURM job, as a job step of its own: when SLURM
    ends it (over its memory, say), the trial's own process, in the job's first step,
    lives on to write the record with SLURM's reason. ``--overlap``: the step shares
    the CPUs and memory of the one this process runs in (it waits meanwhile)."""
    return ["srun", "--ntasks=1", "--nodes=1", "--overlap", "--cpu-bind=none",
            "--kill-on-bad-exit=1", "--unbuffered", *cmd]  # fmt: skip


def cannot_start(spec: dict, runtime: str) -> str | None:
    """Why the ranks of a several-node trial cannot start here (None: they can)."""
    nodes = launchers.nodes(spec)
    if nodes == 1:
        return None
    if not sysinfo.slurm_job():
        return (
            f"nodes {nodes} needs a SLURM job (snakemake --profile profiles/slurm): "
            "outside one there is a single machine"
        )
    if runtime != "local":
        return (
            f"nodes {nodes} runs its ranks with srun in local environments on a shared "
            f"filesystem; runtime {runtime} starts one container per trial on one node "
            "(use runtime: local on the cluster, or nodes: 1)"
        )
    return None
