"""python -m workflow_scripts.trial: one trial (see workflow_scripts/trial/entry.py)."""

import sys

from .entry import main

sys.exit(main())
