"""`GpulaunchProgress`: a Lightning callback that reports each rank's steps to its watcher.

    import lightning as L
    from gpulaunch.integrations.progress import GpulaunchProgress

    trainer = L.Trainer(..., callbacks=[GpulaunchProgress()])

Every rank reports `trainer.global_step` after each optimizer step (accumulated batches
repeat it: only a new step is sent) with the run's total
(`trainer.estimated_stepping_batches`) for an ETA, `READY=1` when training starts, its
epoch as `STATUS=`, and each checkpoint it saved (`checkpoint(step)`, for the job's
goodput). Lightning calls `on_save_checkpoint` while it builds the checkpoint, before the
file is written: the notice goes out at the next batch's start (or the end of training),
once the save returned, so that it never says a step is safe that is not. Under gpulaunch,
`gpulaunch status`/`top` show them and --hang-timeout counts steps (docs/progress.md); run
by anything else the callback does nothing. This module imports Lightning: only a training
script imports it.
"""

from __future__ import annotations

import math
from typing import Any

import lightning.pytorch as pl

from gpulaunch import progress


class GpulaunchProgress(pl.Callback):
    """Reports this rank's optimizer steps through gpulaunch's progress channel."""

    def __init__(self) -> None:
        self._last = -1
        self._saving: int | None = None  # the step of a checkpoint being saved

    def on_save_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        self._saving = trainer.global_step

    def _saved(self) -> None:
        if self._saving is not None:
            progress.checkpoint(self._saving)
            self._saving = None

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self._saved()

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._saved()

    def _total(self, trainer: pl.Trainer) -> int | None:
        try:
            total = trainer.estimated_stepping_batches
        except Exception:  # no estimate (an iterable of unknown length)
            return None
        return int(total) if isinstance(total, int | float) and math.isfinite(total) else None

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        progress.ready()

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        progress.status(f"epoch {trainer.current_epoch}")

    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        step = trainer.global_step
        if step != self._last:
            self._last = step
            progress.step(step, total=self._total(trainer))
