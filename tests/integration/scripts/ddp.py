"""A small gloo DDP job for the multi-node tests: all_reduce steps, one rank may fail.

Every rank writes `<dir>/rank<N>.pid`, `<dir>/rank<N>.failed` (the wall-clock time)
right before it exits with its traceback, and `<dir>/rank<N>.term` (the time) when a
SIGTERM reaches it, so a test can time how fast the other nodes' ranks were stopped;
`<dir>/rank<N>.env` its environment and `<dir>/rank<N>.members` its membership file.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import signal
import sys
import time
import traceback

import torch
import torch.distributed as dist


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--dir", required=True)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--step-time", type=float, default=0.05)
    p.add_argument("--fail-rank", type=int, default=-1)
    p.add_argument("--fail-step", type=int, default=2)
    p.add_argument("--fail-attempt", type=int, default=-1, help="fail only in this attempt")
    p.add_argument("--busy", action="store_true", help="other ranks sleep, not in a collective")
    p.add_argument("--busy-attempt", type=int, default=-1, help="--busy only in this attempt")
    args = p.parse_args()
    rank = int(os.environ["RANK"])
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    if args.fail_attempt not in (-1, attempt):
        args.fail_rank = -1
    if args.busy_attempt not in (-1, attempt):
        args.busy = False

    def stamp(name: str) -> None:
        with open(os.path.join(args.dir, f"rank{rank}.{name}"), "w") as f:
            f.write(repr(time.time()))

    def on_term(signum: int, frame: object) -> None:
        stamp("term")
        os._exit(128 + signum)

    signal.signal(signal.SIGTERM, on_term)
    with open(os.path.join(args.dir, f"rank{rank}.pid"), "w") as f:
        f.write(str(os.getpid()))
    with open(os.path.join(args.dir, f"rank{rank}.env"), "w") as f:
        env = {k: v for k, v in os.environ.items() if k not in ("LS_COLORS",)}
        with open("/proc/self/cgroup") as cgroup:  # its scope (the name says its rank)
            env["/proc/self/cgroup"] = cgroup.read().strip()
        json.dump(env, f)
    members = os.environ.get("GPULAUNCH_MEMBERSHIP_FILE")
    if members:  # what this round's membership file said when the rank started
        with open(members) as src, open(os.path.join(args.dir, f"rank{rank}.members"), "w") as f:
            f.write(src.read())
    dist.init_process_group("gloo")
    world = dist.get_world_size()
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
    for step in range(args.steps):
        if rank == args.fail_rank and step == args.fail_step:
            try:
                raise RuntimeError(f"rank {rank} fails on purpose in step {step}")
            except RuntimeError:
                # The traceback as an uncaught exception prints it, then out at once: the
                # test times gpulaunch, not torch's interpreter teardown (about a second).
                traceback.print_exc()
                sys.stderr.flush()
                stamp("failed")
                os._exit(1)
        if args.busy and step == args.fail_step:
            stamp("busy")
            time.sleep(600)  # "computing": in no collective when the failure happens
        loss = model(torch.ones(2, 4)).sum()
        loss.backward()
        total = torch.tensor([float(rank)])
        dist.all_reduce(total)
        assert total.item() == world * (world - 1) / 2
        time.sleep(args.step_time)
    print(
        f"rank {rank} of {world} done: local {os.environ['LOCAL_RANK']} "
        f"node {os.environ['GROUP_RANK']} of {os.environ['GROUP_WORLD_SIZE']} attempt {attempt}",
        flush=True,
    )
    del model  # the group ends here, not in the interpreter's teardown (examples/ddp_train.py)
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
