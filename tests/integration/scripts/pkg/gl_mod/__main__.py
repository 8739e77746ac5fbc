"""Run as `python -m gl_mod`: proves -m/--module launches a module."""

import os
import sys

print(f"module rank {os.environ['RANK']} argv {sys.argv[1:]}", flush=True)
