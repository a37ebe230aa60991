"""`python -m fold`: the same command as the `fold` console script (fold/cli.py)."""

import sys

from fold.cli import main

sys.exit(main())
