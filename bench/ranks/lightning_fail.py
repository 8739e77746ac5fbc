"""The seed issue's failure, run as `python lightning_fail.py`: a Lightning Trainer with
`--strategy ddp` (Lightning's _SubprocessScriptLauncher) or `--strategy gpulaunch`, CPU,
gloo; rank --fail-rank calls sys.exit(--exit-code) in training step --fail-step.

Every rank stamps `up.<rank>` (time, pid) at its first step; the failing rank stamps
`fail.<rank>` right before it exits: the moment the launcher's reaction is measured from.
--busy S: rank 0 spends S seconds in that step outside any collective (a checkpoint, an
evaluation): it learns of the failure only at its next collective.
"""

from __future__ import annotations

import argparse
import sys
import time

import lightning as L
import torch
from stamp import write_stamp  # bench/ranks/stamp.py: sys.path[0] is this directory
from torch.utils.data import DataLoader, TensorDataset

import gpulaunch.integrations.lightning  # noqa: F401  registers strategy="gpulaunch"

p = argparse.ArgumentParser()
p.add_argument("--dir", required=True)
p.add_argument("--strategy", choices=["ddp", "gpulaunch"], required=True)
p.add_argument("--devices", type=int, default=2)
p.add_argument("--fail-rank", type=int, default=1)
p.add_argument("--fail-step", type=int, default=5)
p.add_argument("--exit-code", type=int, default=7)
p.add_argument("--busy", type=float, default=0.0, help="s rank 0 spends in that step alone")
p.add_argument("--token", required=True)
args = p.parse_args()


class Tiny(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(8, 1)

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        step = batch_idx + 1
        if step == 1:
            write_stamp(args.dir, "up", self.global_rank, time.time())
        if step == args.fail_step and self.global_rank == args.fail_rank:
            write_stamp(args.dir, "fail", self.global_rank, time.time())
            sys.exit(args.exit_code)
        if step == args.fail_step and self.global_rank == 0:
            time.sleep(args.busy)  # a long step of its own (a checkpoint, an evaluation)
        return self.layer(batch[0]).pow(2).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


trainer = L.Trainer(
    accelerator="cpu",
    devices=args.devices,
    strategy=args.strategy,
    max_steps=50,
    logger=False,
    enable_checkpointing=False,
    enable_progress_bar=False,
    enable_model_summary=False,
)
trainer.fit(Tiny(), DataLoader(TensorDataset(torch.randn(512, 8)), batch_size=4))
