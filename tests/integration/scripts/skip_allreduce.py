"""A gloo job where one rank skips an all_reduce: the others wait in it for ever (a hang).

`--fail-rank N` instead makes rank N exit 3 while the others sleep (not in a collective:
gloo would see the failed peer at once and end them).
"""

import argparse
import os
import sys
import time

import torch
import torch.distributed as dist


def elsewhere() -> None:
    time.sleep(600)  # not in a collective: the rank the others wait for


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--dir", required=True)
    p.add_argument("--skip-rank", type=int, default=1)
    p.add_argument("--fail-rank", type=int, default=-1)
    args = p.parse_args()
    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo")
    t = torch.ones(4)
    dist.all_reduce(t)
    print(f"rank {rank}: first all_reduce done", flush=True)
    if rank == args.fail_rank:
        # torch 2.13 aborts about one exit in 15 with a gloo group alive ("terminate called
        # without an active exception", SIGABRT): let go of it first, as torch asks
        dist.destroy_process_group()
        sys.exit(3)
    if rank == args.skip_rank or args.fail_rank >= 0:
        elsewhere()
    dist.all_reduce(t)


if __name__ == "__main__":
    main()
