"""Entry script for one training run (``workflow_scripts.harness``).

A script path rather than ``-m``: ``torch.backends.xeon.run_cpu`` only launches
programs whose name ends in ``.py``.
"""

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def _pin_before_torch() -> None:
    """Apply the spec's CPU list before torch starts its thread pools.

    Under run_cpu, run_cpu pins the process itself (taskset/numactl --core-list).
    """
    if "--spec-json" not in sys.argv:
        return
    spec = json.loads(sys.argv[sys.argv.index("--spec-json") + 1])
    if spec.get("cpus") and spec.get("launcher") != "run_cpu":
        from workflow_scripts.sysinfo import parse_cpu_list

        os.sched_setaffinity(0, parse_cpu_list(spec["cpus"]))


_pin_before_torch()

from workflow_scripts.harness import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
