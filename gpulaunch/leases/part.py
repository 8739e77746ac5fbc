"""The job's GPUs as one of its parts (gpulaunch/parts.py).

- Its lease (`--gpus auto:N`, request.py): every rank holds the lease's fds too, at 3,
  4, ... (`rank_setup`), so the lease lasts as long as the job's last process (store.py).
- Its health gate (health.py): checked before each restart's ranks start
  (`before_attempt`); an unfit GPU's error is that attempt's start error, so the job ends
  with its line. The first attempt is checked by start.py, before anything of the job exists.
- Its accounting (accounting.py): the report's GPU use (`complete`).
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import TYPE_CHECKING

from gpulaunch.leases.accounting import gpu_use
from gpulaunch.model import JobReport, JobSpec, RankSpec
from gpulaunch.parts import Part, RankSetup

if TYPE_CHECKING:
    from gpulaunch.leases.health import Gate
    from gpulaunch.leases.store import Lease


class GpuPart(Part):
    """`lease`, `gate`: None where the job has none (no --gpus auto:N; no GPU, no NVML)."""

    def __init__(self, spec: JobSpec, lease: Lease | None, gate: Gate | None) -> None:
        self.spec = spec
        self.lease = lease
        self.gate = gate
        self.started = time.time()  # its GPU-seconds count from here
        self._checked = False  # the first attempt is, before the job starts (start.py)

    def rank_setup(self, rank: RankSpec, attempt: int) -> RankSetup:
        return RankSetup(fds=tuple(self.lease.fds) if self.lease is not None else ())

    def before_attempt(self, attempt: int) -> None:
        if self._checked and self.gate is not None:
            self.gate.check()  # UnhealthyGpuError: the job ends with its line
        self._checked = True

    def complete(self, report: JobReport) -> JobReport:
        seconds = time.time() - self.started
        return replace(report, gpu_use=gpu_use(self.spec, report, self.gate, seconds))
