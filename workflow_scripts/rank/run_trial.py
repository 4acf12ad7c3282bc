"""Entry script for one training run (``workflow_scripts.rank.harness``).

A script path rather than ``-m``: ``torch.backends.xeon.run_cpu`` only launches
programs whose name ends in ``.py``.
"""

import contextlib
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def _pin_before_torch() -> None:
    """Apply the spec's CPU list (a rank of N: its block of it) before torch starts its
    thread pools.

    A launcher that pins its processes itself (run_cpu: taskset/numactl --core-list)
    is left to do so.
    """
    if "--spec-json" not in sys.argv:
        return
    from workflow_scripts import launchers
    from workflow_scripts.experiment import Spec

    spec = Spec(json.loads(sys.argv[sys.argv.index("--spec-json") + 1]))
    from workflow_scripts.rank.distributed import ranks

    ranks.adopt_slurm()  # a rank that srun started: RANK, WORLD_SIZE, ... from SLURM
    ranks.adopt_mpi()  # a rank that mpirun started (launcher accelerate): from MPI's
    if not launchers.get(spec["launcher"]).pins_itself:
        ranks.pin(spec)


_pin_before_torch()

from workflow_scripts.rank.harness import main  # noqa: E402


def _exit_now(code: int) -> None:
    """End the process once its result is written, without the interpreter's teardown
    (0.5 s of finalizing torch's modules per process here, paid by every rank of every
    trial and measured by nothing): the output flushed first. What the run started and
    left behind (a DataLoader's workers, a compile pool) goes as before: they watch this
    process, and the trial's policy kills what is left of its process group. The
    temporary folders its imports made, which that teardown would have removed, are
    removed here (rank/tempdirs.py)."""
    with contextlib.suppress(Exception):
        from workflow_scripts.rank import tempdirs

        tempdirs.remove()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


if __name__ == "__main__":
    try:
        code = main()
    except SystemExit as exc:  # argparse, and main's own exits
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if exc.code is not None and not isinstance(exc.code, int):
            print(exc.code, file=sys.stderr)
    _exit_now(code or 0)
