"""An unchanged Lightning Fabric DDP script (CPU, gloo) for the launcher tests."""

import argparse
import json
import os
import sys
import traceback

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
try:
    for step in range(5):
        if step == 2 and fabric.global_rank == args.fail_rank:
            raise RuntimeError(f"fabric rank {fabric.global_rank} failed on purpose")
        loss = model(torch.randn(16, 8)).pow(2).mean()
        optimizer.zero_grad()
        fabric.backward(loss)  # all-reduce: the other ranks wait here for the failed one
        optimizer.step()
    fabric.barrier()
    status = 0
except Exception:
    traceback.print_exc()  # as Python would
    status = 1
# torch 2.13 can abort a gloo rank in the interpreter's teardown ("terminate called
# without an active exception", SIGABRT), destroy_process_group() or not, under torchrun
# as under gpulaunch (here: 1 of 25 torchrun runs without it, 1 of 6 gpulaunch runs with
# it), a failing rank's too. These tests are about the launch: once its record is
# written or its error printed, the rank ends without that teardown.
sys.stdout.flush()
sys.stderr.flush()
os._exit(status)
