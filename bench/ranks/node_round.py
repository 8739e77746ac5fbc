"""Scenario 9: gloo ranks on 3 nodes that restart (--max-restarts) or lose a node.

Attempt 0 (TORCHELASTIC_RESTART_COUNT=0): every rank stamps `up.<rank>` after 3
all-reduces, then keeps all-reducing (a training loop); --fail-rank stamps
`fail.<rank>` and raises. A later attempt stamps `first.<rank>` (time.time()) when
its first all-reduce is done, the restarted gang's first step, then ends after a few;
and `born.<rank>`, when its process started (before torch's import).
Each rank writes `group.<rank>` (its node rank) so the bench knows which node is node 2.
"""

from __future__ import annotations

import time

BORN = time.time()  # before torch's import: when the launcher had started this rank

import argparse  # noqa: E402
import datetime  # noqa: E402
import os  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from stamp import write_stamp  # noqa: E402 - bench/ranks/stamp.py: sys.path[0] is this directory


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--dir", required=True)
    p.add_argument("--fail-rank", type=int, default=-1)
    p.add_argument("--token", required=True)
    args = p.parse_args()
    rank = int(os.environ["RANK"])
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    t = torch.ones(1024)
    if attempt > 0:
        write_stamp(args.dir, "born", rank, BORN)
        dist.all_reduce(t)
        write_stamp(args.dir, "first", rank, time.time())
        for _ in range(3):
            dist.all_reduce(t)
        dist.destroy_process_group()
        return
    write_stamp(args.dir, "group", rank, float(os.environ["GROUP_RANK"]))
    for _ in range(3):
        dist.all_reduce(t)
    write_stamp(args.dir, "up", rank, time.time())
    if rank == args.fail_rank:
        time.sleep(0.5)  # every rank is up and in its loop by now
        write_stamp(args.dir, "fail", rank, time.time())
        raise RuntimeError(f"rank {rank} failed on purpose")
    while True:
        dist.all_reduce(t)
        time.sleep(0.05)


if __name__ == "__main__":
    main()
