"""Warm ranks' bench (bench/warm.py): import torch, join a gloo group, stamp the first
all_reduce of each attempt as `first<ATTEMPT>.<rank>`; with --fail-rank, that rank of
attempt 0 stamps `fail.<rank>` and raises once every rank is in its all_reduce loop,
while the others go on reducing; every rank of a later attempt (or of a job without
--fail-rank) exits 0 after its first all_reduce and a barrier.
"""

from __future__ import annotations

import argparse
import datetime
import os
import time

import torch
import torch.distributed as dist
from stamp import write_stamp  # bench/ranks/stamp.py: sys.path[0] is this directory


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--dir", required=True)
    p.add_argument("--fail-rank", type=int, default=-1)
    p.add_argument("--settle", type=float, default=0.5)
    p.add_argument("--token", required=True)
    args = p.parse_args()
    rank = int(os.environ["RANK"])
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    t = torch.ones(1)
    dist.all_reduce(t)
    write_stamp(args.dir, f"first{attempt}", rank, time.time())
    if args.fail_rank < 0 or attempt > 0:
        dist.barrier()
        dist.destroy_process_group()
        return
    if rank == args.fail_rank:
        time.sleep(args.settle)  # the others are in their all_reduce loop by now
        write_stamp(args.dir, "fail", rank, time.time())
        raise RuntimeError(f"rank {rank} fails on purpose")
    while True:
        dist.all_reduce(t)


if __name__ == "__main__":
    main()
