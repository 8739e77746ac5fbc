"""Scenario 1: 4 gloo DDP ranks; --fail-rank raises in --fail-step while the others wait.

The other ranks are in that step's gradient all-reduce (DDP's backward) when it raises.
Right before raising, the failing rank stamps `fail.<rank>` with time.time(): the
failure's "last timestamp" from which the launcher's reaction is measured. Every rank
stamps `up.<rank>` (its pid) once it joined the group. `--record` (scenario 1r): the
entry point is wrapped in torch's `@record`, which writes the error file before the
exception propagates.
"""

from __future__ import annotations

import argparse
import datetime
import os
import time

import torch
import torch.distributed as dist
from stamp import write_stamp  # bench/ranks/stamp.py: sys.path[0] is this directory
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--dir", required=True)
    p.add_argument("--fail-rank", type=int, default=2)
    p.add_argument("--fail-step", type=int, default=3)
    p.add_argument("--settle", type=float, default=0.5, help="s to let the others block first")
    p.add_argument("--record", action="store_true", help="wrap the entry point in @record")
    p.add_argument("--token", required=True)
    args = p.parse_args()
    if args.record:
        from torch.distributed.elastic.multiprocessing.errors import record

        record(train)(args)
    else:
        train(args)


def train(args: argparse.Namespace) -> None:
    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=600))
    write_stamp(args.dir, "up", rank, time.time())
    torch.manual_seed(rank)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(1_000_000):
        if rank == args.fail_rank and step == args.fail_step:
            time.sleep(args.settle)  # the others are waiting in this step's all-reduce by now
            write_stamp(args.dir, "fail", rank, time.time())
            raise RuntimeError(f"rank {rank} failed on purpose in step {step}")
        x = torch.randn(16, 64)
        loss = model(x).square().mean()
        opt.zero_grad()
        loss.backward()  # the all-reduce of the gradients: every rank waits for the others
        opt.step()


if __name__ == "__main__":
    main()
