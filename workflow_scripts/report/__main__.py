"""``python -m workflow_scripts.report``: see the package's docstring."""

import sys

from . import main

sys.exit(main())
