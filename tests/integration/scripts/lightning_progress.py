"""A Lightning Trainer (CPU, gloo) with gpulaunch's progress callback; after `fit` it writes
`<dir>/fitted<RANK>` and stays, so that a test reads `gpulaunch status` while it runs.
--checkpoint-every N: Lightning's ModelCheckpoint saves into <dir> every N steps (the
callback tells the watcher once each save returned)."""

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
p.add_argument("--checkpoint-every", type=int, default=0)
args = p.parse_args()
saving = []
if args.checkpoint_every:
    saving = [
        L.pytorch.callbacks.ModelCheckpoint(
            dirpath=args.dir, every_n_train_steps=args.checkpoint_every, save_top_k=-1
        )
    ]

trainer = L.Trainer(
    accelerator="cpu",
    devices=int(os.environ["WORLD_SIZE"]),
    strategy="ddp",
    max_steps=args.steps,
    logger=False,
    enable_checkpointing=bool(saving),
    enable_progress_bar=False,
    enable_model_summary=False,
    callbacks=[GpulaunchProgress(), *saving],
)
trainer.fit(Tiny(), DataLoader(TensorDataset(torch.randn(64, 8)), batch_size=4))
torch.distributed.destroy_process_group()  # as lightning_trainer.py: no gloo group at exit
with open(os.path.join(args.dir, f"fitted{trainer.global_rank}"), "w") as f:
    f.write(str(trainer.global_step))
time.sleep(300)
