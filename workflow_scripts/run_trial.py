"""Entry script for one training run (``workflow_scripts.harness``).

A script path rather than ``-m``: ``torch.backends.xeon.run_cpu`` only launches
programs whose name ends in ``.py``.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from workflow_scripts.harness import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
