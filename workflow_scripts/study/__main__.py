"""python -m workflow_scripts.study: print the experiments a config expands to."""

import sys

from .config import main

sys.exit(main())
