"""`python -m lab.cli`, the same as the `lab` console script."""

import sys

from . import main

sys.exit(main())
