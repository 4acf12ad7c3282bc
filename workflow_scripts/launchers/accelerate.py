"""``accelerate launch``: Hugging Face Accelerate's launcher, with a config file the study
writes per trial, and the training step through ``Accelerator`` (``prepare``, its
autocast, ``backward``), as a user of Accelerate runs it.

The rank side (``rank/accelerate_launch.py``) writes the config (:meth:`Accelerate.config`:
``use_cpu``, ``mixed_precision``, ``num_processes``, ``distributed_type``; the legacy
``ipex_config``) and a hostfile to a temporary folder, then runs ``accelerate launch
--config_file`` on the harness. What Accelerate allows on a CPU:

- One process: any environment with Accelerate (upstream: the current release;
  ipex: 1.7.0, the last whose ``ipex_config: {ipex: true}`` still calls
  ``ipex.optimize`` on torch >= 2.7).
- Several processes (``ranks``): Accelerate's multi-CPU launch is ``mpirun`` with a
  hostfile (``mpirun_config``); without one it starts a single process. Intel MPI's
  ``mpirun`` comes with oneCCL's wheels, so these trials run in the oneccl
  environment (upstream PyTorch and Accelerate + oneCCL). Accelerate then joins a
  ``gloo`` process group (current releases allow nothing else on CPU: asking for
  another raises "Your assigned backend ccl is not available, please use gloo"), or
  adopts one that exists: ``dist_backend: ccl`` joins the study's ccl group before
  ``Accelerator()``. The ranks pin themselves to their blocks of CPUs, as under
  torchrun (Intel MPI's own pinning off).
- The legacy stack with several processes cannot run: the IPEX environment has no
  ``mpirun``, and Accelerate 1.7.0 picks ``ccl`` only with ``oneccl_bindings_for_pytorch``,
  which was never published on PyPI.
"""

from __future__ import annotations

from pathlib import Path

from .. import backends
from .base import ENTRY
from .torchrun import DIST_ENVS, Torchrun, free_port

#: the backends whose environments hold Accelerate and train eagerly through it
BACKENDS = ("eager", "ipex")
#: the environment (and image) of a multi-process run: Intel MPI's mpirun is there
MULTI_ENV = DIST_ENVS["ccl"]
#: the rank side's wrapper: writes the config file, runs accelerate launch
WRAPPER = ENTRY.with_name("accelerate_launch.py")


class Accelerate(Torchrun):
    name = "accelerate"
    order = 30
    owns = {
        **{k: v for k, v in Torchrun.owns.items() if k != "nodes"},
        "accelerate_ipex": False,
    }
    trains_with_accelerate = True
    layouts = False  # its runs are the transformer tables' (report/families.py)

    def check(self, spec: dict) -> list[str]:
        problems = []
        backend = backends.get(spec["backend"])
        if backend.name not in BACKENDS:
            problems.append(
                f"launcher 'accelerate' runs in an environment with Accelerate: backend "
                f"{' or '.join(repr(b) for b in BACKENDS)} (got backend {backend.name!r})"
            )
        if spec["compile"] != "none":
            problems.append(
                f"compile {spec['compile']!r} with launcher 'accelerate': the study's "
                "Accelerate runs train eagerly (use compile 'none')"
            )
        if spec["accelerate_ipex"]:
            if backend.name != "ipex":
                problems.append(
                    "accelerate_ipex (Accelerate 1.7.0's ipex_config) needs backend 'ipex' "
                    f"(got backend {backend.name!r})"
                )
            if spec["ipex_optimize"]:
                problems.append(
                    "accelerate_ipex and ipex_optimize both call ipex.optimize: set one"
                )
        if self.ranks(spec) > 1:
            if backend.name != "eager":
                problems.append(
                    f"ranks {spec['ranks']} with launcher 'accelerate' needs backend "
                    f"'eager' (Accelerate's multi-CPU launch is mpirun, in the oneccl "
                    f"environment; the IPEX environment has no mpirun, and Accelerate "
                    f"1.7.0's ccl needs oneccl_bindings_for_pytorch, never on PyPI)"
                )
        return problems + self.split_problems(spec) + self.ccl_knob_problems(spec)

    def ranks(self, spec: dict) -> int:
        return int(spec["ranks"])

    def env(self, spec: dict, backend) -> str:
        return MULTI_ENV[0] if self.ranks(spec) > 1 else backend.env

    def image(self, spec: dict, backend) -> str:
        return MULTI_ENV[1] if self.ranks(spec) > 1 else backend.image

    def command(
        self,
        spec: dict,
        python: str,
        harness_args: list[str],
        program: Path = ENTRY,
        starter: str = "local",
    ) -> list[str]:
        """The rank side's wrapper, which writes the config and runs ``accelerate
        launch`` on ``program`` (the harness); on a cluster too, inside the job's one
        node (mpirun starts the ranks there)."""
        return [python, "-u", str(WRAPPER), "--program", str(program), *harness_args]

    def environment(self, spec: dict, starter: str = "local") -> dict[str, str]:
        env = super().environment(spec, "local")
        if self.ranks(spec) > 1:
            env.update(
                STUDY_RANKS_FROM="mpi",
                # Intel MPI starts the ranks on this host without ssh, and leaves their
                # pinning to them (each takes its block of the trial's CPUs)
                I_MPI_HYDRA_BOOTSTRAP="fork",
                I_MPI_PIN="0",
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=str(free_port()),
            )
        return env

    def config(self, spec: dict, hostfile: str) -> dict:
        """Accelerate's config file (``accelerate launch --config_file``) for the spec."""
        n = self.ranks(spec)
        cfg = {
            "compute_environment": "LOCAL_MACHINE",
            "distributed_type": "MULTI_CPU" if n > 1 else "NO",
            "use_cpu": True,
            "num_processes": n,
            "num_machines": 1,
            "machine_rank": 0,
            "mixed_precision": "bf16" if spec["precision"] == "bf16" else "no",
        }
        if n > 1:
            cfg["mpirun_config"] = {"mpirun_hostfile": hostfile}
        if spec["accelerate_ipex"]:
            cfg["ipex_config"] = {"ipex": True}
        return cfg

    def verify(self, spec: dict) -> None:
        import os

        if os.environ.get("ACCELERATE_USE_CPU", "").lower() != "true":
            raise RuntimeError(
                "launcher 'accelerate': this rank was not started by accelerate launch "
                "with use_cpu (ACCELERATE_USE_CPU is not true)"
            )


LAUNCHER = Accelerate()
