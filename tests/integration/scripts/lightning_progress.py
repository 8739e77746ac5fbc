"""A Lightning Trainer (CPU, gloo) with gpulaunch's progress callback; after `fit` it writes
`<dir>/fitted<RANK>` and stays, so that a test reads `gpulaunch status` while it runs."""

import argparse
import os
import time

import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset

from gpulaunch.integrations.progress import GpulaunchProgress


class Tiny(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(8, 1)

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        (x,) = batch
        return self.layer(x).pow(2).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


p = argparse.ArgumentParser()
p.add_argument("--dir", required=True)
p.add_argument("--steps", type=int, default=20)
args = p.parse_args()

trainer = L.Trainer(
    accelerator="cpu",
    devices=int(os.environ["WORLD_SIZE"]),
    strategy="ddp",
    max_steps=args.steps,
    logger=False,
    enable_checkpointing=False,
    enable_progress_bar=False,
    enable_model_summary=False,
    callbacks=[GpulaunchProgress()],
)
trainer.fit(Tiny(), DataLoader(TensorDataset(torch.randn(64, 8)), batch_size=4))
torch.distributed.destroy_process_group()  # as lightning_trainer.py: no gloo group at exit
with open(os.path.join(args.dir, f"fitted{trainer.global_rank}"), "w") as f:
    f.write(str(trainer.global_step))
time.sleep(300)
