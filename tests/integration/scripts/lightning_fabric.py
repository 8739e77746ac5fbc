"""An unchanged Lightning Fabric DDP script (CPU, gloo) for the launcher tests."""

import argparse
import json
import os

import lightning as L
import torch

p = argparse.ArgumentParser()
p.add_argument("--dir", required=True)
p.add_argument("--devices", type=int, default=2)
p.add_argument("--fail-rank", type=int, default=None)
args = p.parse_args()

fabric = L.Fabric(accelerator="cpu", devices=args.devices, strategy="ddp")
fabric.launch()
record = {
    "global_rank": fabric.global_rank,
    "world_size": fabric.world_size,
    "pid": os.getpid(),
    "ppid": os.getppid(),
    "environment": type(fabric.strategy.cluster_environment).__name__,
}
with open(os.path.join(args.dir, f"fabric{fabric.global_rank}.json"), "w") as f:
    json.dump(record, f)
model = torch.nn.Linear(8, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
model, optimizer = fabric.setup(model, optimizer)
for step in range(5):
    if step == 2 and fabric.global_rank == args.fail_rank:
        raise RuntimeError(f"fabric rank {fabric.global_rank} failed on purpose")
    loss = model(torch.randn(16, 8)).pow(2).mean()
    optimizer.zero_grad()
    fabric.backward(loss)  # all-reduce: the other ranks wait here for the failed one
    optimizer.step()
fabric.barrier()
# The script's own end, as torch asks: with a gloo group alive at interpreter exit, torch
# 2.13 aborts the rank about one run in fifteen ("terminate called without an active
# exception", SIGABRT) under torchrun as under gpulaunch (measured: 1 of 15 under torchrun).
torch.distributed.destroy_process_group()
