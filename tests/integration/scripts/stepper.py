"""A rank that reports steps through gpulaunch.progress (no torch: fast to start).

Writes `<dir>/rank<N>.pid`; after its steps `rank<N>.refused` (how many of its steps
the channel refused) and `rank<N>.done` (the wall time of its last step), then it stays
(sleeping, or printing without stepping with --print-rank).
"""

from __future__ import annotations

import argparse
import os
import time

from gpulaunch.progress import status, step


def stall_forever(printing: bool, rank: int) -> None:
    while True:
        if printing:
            print(f"rank {rank} is busy but takes no step", flush=True)
        time.sleep(0.1)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--dir", required=True)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--step-seconds", type=float, default=0.1)
    p.add_argument("--slow-rank", type=int, default=-1)
    p.add_argument("--slow-extra", type=float, default=0.2)
    p.add_argument("--slow-steps", type=int, default=0, help="slow only for its first N steps")
    p.add_argument("--print-rank", type=int, default=-1, help="one step less, then prints forever")
    p.add_argument("--exit", action="store_true", help="exit 0 after the steps")
    p.add_argument("--in-child", action="store_true", help="a child of the rank steps")
    args = p.parse_args()
    rank = int(os.environ["RANK"])
    with open(os.path.join(args.dir, f"rank{rank}.pid"), "w") as f:
        f.write(str(os.getpid()))
    if args.in_child and os.fork() != 0:  # the rank's main process waits for its child
        os._exit(os.waitstatus_to_exitcode(os.wait()[1]))
    status(f"rank {rank} warming up")
    extra = args.slow_extra if rank == args.slow_rank else 0.0
    steps = args.steps - 1 if rank == args.print_rank else args.steps  # it falls behind
    refused = 0  # steps the channel had no room for
    for n in range(1, steps + 1):
        slow = extra if not args.slow_steps or n <= args.slow_steps else 0.0
        time.sleep(args.step_seconds + slow)
        refused += not step(n, total=args.steps)
    with open(os.path.join(args.dir, f"rank{rank}.refused"), "w") as f:
        f.write(str(refused))
    with open(os.path.join(args.dir, f"rank{rank}.done"), "w") as f:
        f.write(repr(time.time()))
    if args.in_child:  # a process's datagram is known by its ancestry only while it lives
        time.sleep(1.0)
    if args.exit:
        return
    status(f"rank {rank} done stepping")
    stall_forever(rank == args.print_rank, rank)


if __name__ == "__main__":
    main()
