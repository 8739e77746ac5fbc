"""An unchanged Lightning Trainer DDP script (CPU, gloo) for the launcher tests."""

import argparse
import json
import os
import sys
import traceback

import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset


class Tiny(L.LightningModule):
    def __init__(self, fail_rank: int | None) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(8, 1)
        self.fail_rank = fail_rank

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        if batch_idx == 2 and self.global_rank == self.fail_rank:
            raise RuntimeError(f"trainer rank {self.global_rank} failed on purpose")
        (x,) = batch
        return self.layer(x).pow(2).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


p = argparse.ArgumentParser()
p.add_argument("--dir", required=True)
p.add_argument("--devices", type=int, default=2)
p.add_argument("--fail-rank", type=int, default=None)
args = p.parse_args()

trainer = L.Trainer(
    accelerator="cpu",
    devices=args.devices,
    strategy="ddp",
    max_steps=5,
    logger=False,
    enable_checkpointing=False,
    enable_progress_bar=False,
    enable_model_summary=False,
)
model = Tiny(args.fail_rank)
data = DataLoader(TensorDataset(torch.randn(64, 8)), batch_size=4)
try:
    trainer.fit(model, data)
except Exception:
    traceback.print_exc()  # as Python would; then without torch's teardown (see the end)
    sys.stderr.flush()
    os._exit(1)
record = {
    "global_rank": trainer.global_rank,
    "world_size": trainer.world_size,
    "pid": os.getpid(),
    "ppid": os.getppid(),
    "environment": type(trainer.strategy.cluster_environment).__name__,
}
with open(os.path.join(args.dir, f"trainer{trainer.global_rank}.json"), "w") as f:
    json.dump(record, f)
# torch 2.13 can abort a gloo rank in the interpreter's teardown ("terminate called
# without an active exception", SIGABRT), destroy_process_group() or not, under torchrun
# as under gpulaunch (here: 1 of 25 torchrun runs without it, 1 of 6 gpulaunch runs with
# it), a failing rank's too. These tests are about the launch: once its record is
# written or its error printed, the rank ends without that teardown.
sys.stdout.flush()
sys.stderr.flush()
os._exit(0)
