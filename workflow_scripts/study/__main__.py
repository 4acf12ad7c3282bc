"""python -m workflow_scripts.study: print the experiments a config expands to."""

import sys

from .entry import main

sys.exit(main())
