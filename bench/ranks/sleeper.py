"""Scenarios 2, 4, 6: stamp `ready.<rank>` as the first thing, then sleep.

Imports nothing heavy, so the stamp measures the launcher and the interpreter's
start, not the rank's own imports. SIGTERM ends it at once (default disposition).
"""

import time

started = time.time()

import argparse  # noqa: E402
import os  # noqa: E402

from stamp import write_stamp  # noqa: E402 - sys.path[0] is this directory

p = argparse.ArgumentParser()
p.add_argument("--dir", required=True)
p.add_argument("--sleep", type=float, required=True)
p.add_argument("--token", required=True)
args = p.parse_args()
write_stamp(args.dir, "ready", int(os.environ["RANK"]), started)
time.sleep(args.sleep)
