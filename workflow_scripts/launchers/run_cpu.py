"""``python -m torch.backends.xeon.run_cpu``: the article's launcher, which preloads an
allocator (jemalloc, tcmalloc) and an OpenMP runtime and pins the process."""

from __future__ import annotations

import os
from pathlib import Path

from .. import sysinfo
from .base import ENTRY, Launcher, mapped_library_names

# What to install when run_cpu could not preload a library (it only logs a warning).
HINTS = {
    "libjemalloc": "libjemalloc2 (Debian/Ubuntu)",
    "libtcmalloc": "libgoogle-perftools4 (Debian/Ubuntu)",
    "libiomp5": "the intel-openmp wheel (in the environment's requirements)",
}


class RunCpu(Launcher):
    name = "run_cpu"
    order = 10
    owns = {"allocator": "default", "openmp": "gnu"}
    pins_itself = True

    def args(self, spec: dict) -> list[str]:
        """run_cpu's options for the spec."""
        args = {
            "default": ["--use-default-allocator"],
            "jemalloc": ["--enable-jemalloc"],
            "tcmalloc": ["--enable-tcmalloc"],
        }[spec["allocator"]]
        if spec["openmp"] != "intel":
            args.append("--disable-iomp")
        if spec.get("threads"):
            # "=" form: the option takes several values and would swallow the program path
            args.append(f"--ncores-per-instance={spec['threads']}")
        if spec.get("cpus"):
            cpus = sysinfo.parse_cpu_list(spec["cpus"])
            args.append("--core-list=" + ",".join(map(str, cpus)))
        return args

    def rank_command(
        self, spec: dict, python: str, harness_args: list[str], program: Path = ENTRY
    ) -> list[str]:
        plain = super().rank_command(spec, python, harness_args, program)
        return [python, "-u", "-m", "torch.backends.xeon.run_cpu", *self.args(spec), *plain[2:]]

    def verify(self, spec: dict) -> None:
        """Fail when run_cpu could not put the requested allocator/OpenMP in force: it
        only logs a warning, and a silent fallback would label a default-allocator run
        as tcmalloc/jemalloc."""
        names = mapped_library_names()
        wanted = []
        if spec["allocator"] != "default":
            wanted.append(f"lib{spec['allocator']}")
        if spec["openmp"] == "intel":
            wanted.append("libiomp5")
        missing = [w for w in wanted if not any(n.startswith(w) for n in names)]
        if missing:
            raise RuntimeError(
                "run_cpu did not preload "
                + ", ".join(missing)
                + f" (LD_PRELOAD={os.environ.get('LD_PRELOAD')!r}); install "
                + ", ".join(HINTS[m] for m in missing)
                + " and rebuild the environment"
            )


LAUNCHER = RunCpu()
