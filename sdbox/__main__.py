"""`python -m sdbox`: see sdbox.cli."""

import sys

from sdbox.cli import main

sys.exit(main())
