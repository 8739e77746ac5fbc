"""Scenario 8: stamp `ready.<rank>` first, then sleep; the last rank of the job fails on cue.

Plain Python (no torch, no process group): the launchers' rendezvous gives every rank
its RANK and WORLD_SIZE, which is what is timed. The last global rank, with `--fail`,
exits 1 once `<dir>/fail` exists (checked every 5 ms: the cue's time is the bench's).
SIGTERM ends any rank at once (default disposition).
"""

import time

started = time.time()

import argparse  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402

from stamp import write_stamp  # noqa: E402 - sys.path[0] is this directory

p = argparse.ArgumentParser()
p.add_argument("--dir", required=True)
p.add_argument("--fail", action="store_true")
p.add_argument("--token", required=True)
args = p.parse_args()
rank = int(os.environ["RANK"])
write_stamp(args.dir, "ready", rank, started)
cue = os.path.join(args.dir, "fail")
if args.fail and rank == int(os.environ["WORLD_SIZE"]) - 1:
    while not os.path.exists(cue):
        time.sleep(0.005)
    sys.exit(1)
time.sleep(3600)
