"""A Lightning script run as `python lightning_strategy.py` with strategy="gpulaunch".

Before Trainer/Fabric: appends its pid to DIR/before.txt (every process that runs
the script: the one the test started, then each rank). The process the test started
writes DIR/original.pid. Each rank writes DIR/rankN.pid (its pid only, for
tests/integration/jobs.Job.alive) and DIR/rankN.json (pid, ppid, LOCAL_RANK, ...).
--hold: every rank waits at step 1 until DIR/release exists. --fail-rank R
--fail-step S --exit-code C: rank R calls sys.exit(C) at step S.
"""

import argparse
import atexit
import json
import os
import sys
import time

import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset

import gpulaunch.integrations.lightning  # noqa: F401  registers strategy="gpulaunch"
from gpulaunch.integrations.lightning import GpulaunchFabricStrategy, GpulaunchStrategy

p = argparse.ArgumentParser()
p.add_argument("--dir", required=True)
p.add_argument("--kind", choices=["trainer", "fabric"], default="trainer")
p.add_argument("--job", default=None)
p.add_argument("--devices", default="2")
p.add_argument("--by-name", action="store_true", help='strategy="gpulaunch", not an instance')
p.add_argument("--fail-rank", type=int, default=None)
p.add_argument("--fail-step", type=int, default=5)
p.add_argument("--exit-code", type=int, default=7)
p.add_argument("--hold", action="store_true")
p.add_argument("--steps", type=int, default=8)
p.add_argument("--num-nodes", type=int, default=1)
p.add_argument("--launch-fn", action="store_true", help="Fabric: the loop in fabric.launch(fn)")
args = p.parse_args()
out = args.dir
devices = args.devices if args.devices == "auto" else int(args.devices)

with open(os.path.join(out, "before.txt"), "a") as f:
    f.write(f"{os.getpid()}\n")
if "GPULAUNCH_JOB" not in os.environ:
    with open(os.path.join(out, "original.pid"), "w") as f:
        f.write(str(os.getpid()))


def at_exit() -> None:
    """Registered before Lightning's: runs after the strategy's own exit hook (LIFO), so
    it sees whether the strategy let go of the process group (no explicit destroy here)."""
    rank = os.environ.get("RANK")
    if rank is not None and "GPULAUNCH_JOB" in os.environ:
        with open(os.path.join(out, f"exit{rank}.json"), "w") as f:
            json.dump({"initialized": torch.distributed.is_initialized()}, f)


atexit.register(at_exit)


def started(rank: int) -> None:
    with open(os.path.join(out, f"rank{rank}.pid"), "w") as f:
        f.write(str(os.getpid()))
    record = {
        "rank": rank,
        "pid": os.getpid(),
        "ppid": os.getppid(),
        "LOCAL_RANK": os.environ.get("LOCAL_RANK"),
        "GPULAUNCH_JOB": os.environ.get("GPULAUNCH_JOB"),
        "cmdline": open("/proc/self/cmdline").read().split("\0")[:-1],
        "cwd": os.getcwd(),
        "host": os.uname().nodename,
        "WORLD_SIZE": os.environ.get("WORLD_SIZE"),
    }
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(record, f)


def step_hook(rank: int, step: int) -> None:
    if step == 1:
        started(rank)
        while args.hold and not os.path.exists(os.path.join(out, "release")):
            time.sleep(0.05)
    if step == args.fail_step and rank == args.fail_rank:
        sys.exit(args.exit_code)


def finish(rank: int, world: int, environment: str, extra: dict[str, object]) -> None:
    with open(os.path.join(out, f"done{rank}.json"), "w") as f:
        json.dump({"world_size": world, "environment": environment, **extra}, f)


class Tiny(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(8, 1)

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        step_hook(self.global_rank, batch_idx + 1)
        (x,) = batch
        return self.layer(x).pow(2).mean()

    def validation_step(self, batch: list[torch.Tensor], batch_idx: int) -> None:
        self.log("val", self.layer(batch[0]).pow(2).mean(), sync_dist=True)

    def test_step(self, batch: list[torch.Tensor], batch_idx: int) -> None:
        self.log("test", self.layer(batch[0]).pow(2).mean(), sync_dist=True)

    def predict_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        return self.layer(batch[0])

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


data = DataLoader(TensorDataset(torch.randn(64, 8)), batch_size=4)

if args.kind == "trainer":
    trainer = L.Trainer(
        accelerator="cpu",
        devices=devices,
        num_nodes=args.num_nodes,
        strategy="gpulaunch" if args.by_name else GpulaunchStrategy(job=args.job, grace=5),
        max_steps=args.steps,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=2,
    )
    model = Tiny()
    trainer.fit(model, data)
    trainer.strategy.barrier()
    trainer.save_checkpoint(os.path.join(out, "model.ckpt"))  # rank 0 writes it
    trainer.validate(model, data)
    trainer.test(model, data)
    predictions = trainer.predict(model, data)
    trainer.fit_loop.epoch_loop.max_steps = args.steps + 2
    trainer.fit(model, data)  # a second fit in the same script
    finish(
        trainer.global_rank,
        trainer.world_size,
        type(trainer.strategy.cluster_environment).__name__,
        {"strategy": type(trainer.strategy).__name__, "predictions": len(predictions or [])},
    )
    trainer.strategy.barrier()
    # no destroy_process_group(): the strategy lets go of it at exit (see exitN.json)
else:
    fabric = L.Fabric(
        accelerator="cpu",
        devices=devices,
        strategy="gpulaunch" if args.by_name else GpulaunchFabricStrategy(job=args.job, grace=5),
    )

    def train(fabric: L.Fabric) -> None:
        model = torch.nn.Linear(8, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        model, optimizer = fabric.setup(model, optimizer)
        for step in range(1, args.steps + 1):
            step_hook(fabric.global_rank, step)
            loss = model(torch.randn(16, 8)).pow(2).mean()
            optimizer.zero_grad()
            fabric.backward(loss)
            optimizer.step()
        fabric.barrier()

    if args.launch_fn:
        fabric.launch(train)
    else:
        fabric.launch()
        train(fabric)
    finish(
        fabric.global_rank,
        fabric.world_size,
        type(fabric.strategy.cluster_environment).__name__,
        {"strategy": type(fabric.strategy).__name__},
    )
    fabric.barrier()
