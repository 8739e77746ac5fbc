"""A real DDP training loop on synthetic data: the gpulaunch demo and test workload.

Runs under any launcher that sets torchrun's variables (gpulaunch, torchrun):
gloo on CPU, NCCL when CUDA is available. `--fail-rank K --fail-step S` makes
rank K raise in step S while the other ranks wait in the next all-reduce: the
scenario where other launchers hang until the collective times out.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--fail-rank", type=int, default=None, help="this rank raises ...")
    p.add_argument("--fail-step", type=int, default=3, help="... in this step")
    p.add_argument("--step-sleep", type=float, default=0.0, help="seconds to sleep per step")
    p.add_argument("--timeout", type=float, default=1800, help="collective timeout in seconds")
    return p.parse_args()


def main() -> None:
    args = parse_args()
    rank = int(os.environ["RANK"])
    local_rank = int(os.environ["LOCAL_RANK"])
    world = int(os.environ["WORLD_SIZE"])
    cuda = torch.cuda.is_available()
    # cuda:LOCAL_RANK; cuda:0 where each rank sees only its own GPU (gpulaunch --gpu-isolation)
    gpu = local_rank % torch.cuda.device_count() if cuda else 0
    device = torch.device("cuda", gpu) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group(
        "nccl" if cuda else "gloo", timeout=datetime.timedelta(seconds=args.timeout)
    )
    torch.manual_seed(1234 + rank)
    model = nn.Sequential(nn.Linear(64, args.hidden), nn.ReLU(), nn.Linear(args.hidden, 1)).to(
        device
    )
    ddp = DistributedDataParallel(model, device_ids=[gpu] if cuda else None)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    target_w = torch.randn(64, 1, device=device)
    if rank == 0:
        print(f"training: world size {world}, {args.steps} steps on {device.type}", flush=True)
    for step in range(args.steps):
        if args.fail_rank == rank and step == args.fail_step:
            raise RuntimeError(f"rank {rank} failed on purpose in step {step}")
        x = torch.randn(args.batch, 64, device=device)
        loss = nn.functional.mse_loss(ddp(x), x @ target_w)
        opt.zero_grad()
        loss.backward()  # all-reduce of the gradients: every rank waits here for the others
        opt.step()
        if rank == 0 and (step % 10 == 0 or step == args.steps - 1):
            print(f"step {step:4d}  loss {loss.item():.4f}", flush=True)
        if args.step_sleep:
            time.sleep(args.step_sleep)
    dist.barrier()
    if rank == 0:
        print("training done", flush=True)
    # The model holds the process group: let it go first, so that the group ends here
    # and not in the interpreter's teardown, where torch 2.13 (gloo) aborts now and then
    # ("terminate called without an active exception"; under torchrun here: 2 of 30
    # runs with the model kept, 0 of 90 with it let go).
    del ddp, opt
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
