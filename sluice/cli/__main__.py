"""``python -m sluice.cli``: the same as the ``sluice`` console script."""

import sys

from sluice.cli.app import main

sys.exit(main())
