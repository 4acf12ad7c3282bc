"""What a launcher is: how one trial becomes the processes of its ranks, and how the
ranks' results become one.

A launcher module (``launchers/<name>.py``) defines ``LAUNCHER``, an instance of a
:class:`Launcher` subclass, named by the value of the ``launcher`` field. It turns a
trial into the command line that starts its N ranks (:meth:`command`, with threads,
affinity and preloads: the rank itself for N = 1, or a launcher such as torchrun or
srun that starts N), and merges the N results into the one result of the trial
(:meth:`merge`). A single-process trial is N = 1. The runtime (a local environment
or a container) wraps the command; the trial policy (``workflow_scripts.trial``)
decides how often to run them. Standard library only: :meth:`verify` runs inside
each rank's process, in the backend's environment.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

# The harness's entry script: a path, because run_cpu only launches programs ending in .py.
ENTRY = Path(__file__).resolve().parent.parent / "rank" / "run_trial.py"


class Launcher:
    #: the value of the ``launcher`` field
    name: str = ""
    #: position among the launchers (the schema's values, messages, the report)
    order: int = 100
    #: knobs only this launcher acts on, with their neutral value
    owns: dict[str, Any] = {}
    #: whether the launcher pins its processes to the spec's CPUs itself (else the
    #: rank pins itself before torch starts its threads)
    pins_itself: bool = False
    #: its ranks join a process group and train one DistributedDataParallel model
    distributed: bool = False
    #: its ranks train through Hugging Face Accelerate's ``Accelerator``
    trains_with_accelerate: bool = False
    #: it starts any rank script (the allreduce benchmark's too), and its multi-rank runs
    #: are the data-parallel layouts the report's distributed section compares
    layouts: bool = False
    #: environments only this launcher's runs use (besides the backends' own)
    envs: set[str] = set()
    #: images only this launcher's runs use: name -> (parent image, the lock it installs)
    images: dict[str, tuple[str, str]] = {}
    #: compiled extensions an environment gets when its lock holds their library (built
    #: ahead of time, never per run): name -> (the requirement that brings the library,
    #: the build script, its sources, the folder under the prefix it builds into)
    extensions: dict[str, tuple[str, str, tuple[str, ...], str]] = {}

    def check(self, spec: dict) -> list[str]:
        """Combination problems of a resolved spec with this launcher."""
        return []

    def env(self, spec: dict, backend) -> str:
        """The environment a run of this spec uses (the backend's own, unless the
        launcher needs more, as torchrun's ccl needs oneCCL)."""
        return backend.env

    def image(self, spec: dict, backend) -> str:
        """The image a container run of this spec uses (see :meth:`env`)."""
        return backend.image

    def ranks(self, spec: dict) -> int:
        """How many processes a trial of this spec runs."""
        return 1

    def rank_command(
        self, spec: dict, python: str, harness_args: list[str], program: Path = ENTRY
    ) -> list[str]:
        """The command line of one rank (the harness, or another ``program``, with its
        arguments)."""
        return [python, "-u", str(program), *harness_args]

    def command(
        self,
        spec: dict,
        python: str,
        harness_args: list[str],
        program: Path = ENTRY,
        starter: str = "local",
    ) -> list[str]:
        """The command line that starts the trial's ranks. With N > 1 ranks the result
        path in ``harness_args`` holds ``{rank}``, which each rank fills in with its
        ``RANK`` (see :func:`rank_path`). ``starter``: ``local`` (this machine), or
        ``srun`` (inside a SLURM job: one task per rank, see :func:`starter`)."""
        return self.rank_command(spec, python, harness_args, program)

    def environment(self, spec: dict, starter: str = "local") -> dict[str, str]:
        """Variables the launcher sets for its ranks (threads; preloads are its own)."""
        env = {}
        if spec.get("threads"):
            env["OMP_NUM_THREADS"] = str(spec["threads"])
        return env

    def merge(self, results: list[dict]) -> dict:
        """The trial's result from its ranks' results (N = 1: the one result)."""
        if len(results) != 1:
            raise ValueError(f"launcher {self.name!r} runs one process, got {len(results)}")
        return results[0]

    def verify(self, spec: dict) -> None:
        """Inside a rank, before any work: raise when what the launcher promised did not
        take effect (e.g. a preload that did not happen)."""


def nodes(spec: dict) -> int:
    """The machines a trial's ranks run on (1 for a spec from before the field)."""
    return int(spec.get("nodes") or 1)


def starter(launcher: Launcher, spec: dict, runtime_name: str) -> str:
    """How the ranks start: ``srun`` for several ranks inside a SLURM job (the cluster
    profile's, in local environments), else ``local``. (One rank inside a SLURM job
    still runs as a job step of its own, so that a step SLURM ends leaves the trial's
    process to record why: ``trial.attempt.slurm_step`` wraps its command.)"""
    from ..sysinfo import slurm_job

    if launcher.ranks(spec) > 1 and runtime_name == "local" and slurm_job():
        return "srun"
    return "local"


def result_paths(out: Path, ranks: int) -> tuple[str, list[Path]]:
    """Where a trial's ranks write their results, next to its record ``out``: the path
    the harness is given (with ``{rank}`` when N > 1) and the N paths it becomes."""
    if ranks == 1:
        path = out.with_name(out.stem + ".harness.json").resolve()
        return str(path), [path]
    template = out.with_name(out.stem + ".rank{rank}.harness.json").resolve()
    return str(template), [Path(str(template).format(rank=r)) for r in range(ranks)]


def rank_path(path: str) -> str:
    """In a rank: its own result path (``{rank}`` filled in from ``RANK``)."""
    return path.replace("{rank}", os.environ.get("RANK", "0"))


def harness_args(spec_json: str, result_path: str, data_path: str | None) -> list[str]:
    args = ["--spec-json", spec_json, "--out", result_path]
    if data_path:
        args += ["--data-path", str(data_path)]
    return args


def mapped_library_names() -> list[str]:
    from .. import sysinfo

    return [os.path.basename(p) for p in sysinfo.mapped_libraries()]
