"""Shared by the GPU checks: the rank script, device nodes, what nvidia-smi lists."""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

from gpulaunch.plan.gpus import Gpu, MachineInventory
from tests.gpu import nvsmi
from tests.integration.jobs import GPULAUNCH, REPO, Job

RANK = str(REPO / "tests" / "gpu" / "scripts" / "cuda_rank.py")
# The driver's shared nodes, as present on this machine (nvidia-caps: read-only rule).
SHARED_NODES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset")


def machine_gpus() -> tuple[Gpu, ...]:
    gpus = MachineInventory().gpus()
    assert gpus, "gpulaunch's inventory found no GPU where the gate found one"
    return gpus


def shared_nodes() -> list[str]:
    """The driver's shared nodes that exist here (nvidia-uvm appears once CUDA loaded it)."""
    present = [p for p in SHARED_NODES if os.path.exists(p)]
    return present + sorted(glob.glob("/dev/nvidia-caps/nvidia-cap*"))


def unused_minor(gpus: Sequence[Gpu]) -> int:
    """A /dev/nvidia<N> minor that no GPU here has: a GPU the rank was not given."""
    taken = {g.minor for g in gpus}
    return next(m for m in range(254) if m not in taken)


def start_argv(job: Job, *opts: str, mode: str, script_args: Sequence[str] = ()) -> list[str]:
    return [
        *(GPULAUNCH, "start", "--job", job.id, *opts),
        *(RANK, "--dir", str(job.dir), "--mode", mode, *script_args),
    ]


def run_outside(
    job: Job, script_args: Sequence[str], env: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """The rank script in probe mode, not under gpulaunch, in the same systemd (box)."""
    prefix = ["env", *(f"{k}={v}" for k, v in (env or {}).items())]
    res = job.box.run(
        [*prefix, sys.executable, RANK, "--dir", str(job.dir), "--mode", "probe", "--outside",
         *script_args],
        cwd=str(REPO), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    return report(job, "outside")


def report(job: Job, name: str) -> dict[str, Any]:
    data = json.loads((job.dir / f"{name}.json").read_text())
    assert isinstance(data, dict)
    return data


def job_compute_pids(before: frozenset[int], count: int, timeout: float = 60) -> frozenset[int]:
    """The pids nvidia-smi lists that were not there before the job, once there are `count`.

    In the host's pid namespace (nvidia-smi runs where pytest runs, outside the box).
    """
    deadline = time.monotonic() + timeout
    while True:
        new = nvsmi.compute_pids() - before
        if len(new) >= count:
            return new
        if time.monotonic() > deadline:
            raise AssertionError(f"nvidia-smi listed {sorted(new)} new, not {count} ranks")
        time.sleep(0.1)


def seconds_until_gone(pids: frozenset[int], since: float, limit: float) -> float:
    """Seconds from `since` until nvidia-smi lists none of `pids`; fails after `limit`."""
    while True:
        left = nvsmi.compute_pids() & pids
        took = time.monotonic() - since
        if not left:
            return took
        if took > limit:
            raise AssertionError(f"nvidia-smi still lists {sorted(left)} {took:.2f} s after")
        time.sleep(0.05)


def popen(job: Job, argv: list[str]) -> subprocess.Popen[str]:
    return job.box.popen(
        argv, cwd=str(REPO), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def hold(job: Job) -> tuple[frozenset[int], subprocess.Popen[str]]:
    """Start a 2-rank job whose ranks each hold 256 MiB; return their pids as nvidia-smi
    lists them, and the watcher process."""
    before = nvsmi.compute_pids()
    proc = popen(job, start_argv(job, "--nproc", "2", mode="hold"))
    try:
        for rank in (0, 1):
            job.wait_file(f"rank{rank}.ready", timeout=120)
        pids = job_compute_pids(before, 2)
    except BaseException:
        proc.kill()
        proc.communicate()
        raise
    return pids, proc
