"""Scenario 7: gloo ranks on 3 nodes; --fail-rank raises after a few all-reduces.

Every rank stamps `pid.<rank>` in its node's --dir first. After --steps all-reduces,
the failing rank waits --settle s, stamps `fail.<rank>` with time.time() (the failure's
"last timestamp") and raises, while the others are
- `collective`: waiting in the next all-reduce, which the failing rank never joins;
- `busy`: not in a collective (a long sleep stands in for a long compute step).
"""

from __future__ import annotations

import argparse
import datetime
import os
import time

import torch
import torch.distributed as dist
from stamp import write_stamp  # bench/ranks/stamp.py: sys.path[0] is this directory

COLLECTIVE, BUSY = "collective", "busy"


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--dir", required=True)
    p.add_argument("--mode", choices=(COLLECTIVE, BUSY), required=True)
    p.add_argument("--fail-rank", type=int, default=3)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--settle", type=float, default=0.5, help="s to let the others get there")
    p.add_argument("--busy", type=float, default=600.0, help="s the `busy` ranks compute")
    p.add_argument("--token", required=True)
    args = p.parse_args()
    rank = int(os.environ["RANK"])
    write_stamp(args.dir, "pid", rank, time.time())
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=600))
    t = torch.ones(1024)
    for _ in range(args.steps):
        dist.all_reduce(t)
    if rank == args.fail_rank:
        time.sleep(args.settle)  # the others are in the next all-reduce (or computing) by now
        write_stamp(args.dir, "fail", rank, time.time())
        raise RuntimeError(f"rank {rank} failed on purpose after {args.steps} steps")
    if args.mode == COLLECTIVE:
        dist.all_reduce(t)  # waits for the failed rank
    else:
        time.sleep(args.busy)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
