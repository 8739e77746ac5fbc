"""The health gate: each GPU a job would use, checked through NVML before it starts (and
before each restart, --max-restarts); a GPU that is not fit refuses the job in one line naming
the GPU and the reason.

Refused: the GPU is lost (NVML_ERROR_GPU_IS_LOST); another process holds memory on it (unless
`--allow-busy-gpus`; at a restart, processes of the job itself do not count); uncorrected ECC
errors since the driver loaded (volatile counter); retired pages pending a reset, or rows
pending remapping or a remapping failure; an XID error NVML reports through its event API
(critical XIDs registered for on every GPU when the gate opens NVML: at a later check, those
that happened since).

No NVML (no pynvml, no driver): nothing to check, the job starts (a job with --gpus on a
machine without NVML found its GPUs in /proc/driver/nvidia). A query the GPU does not support
is no reason to refuse it.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpulaunch.base.nvml import NvmlUnavailable, start_nvml
from gpulaunch.errors import GpulaunchError, UnavailableError
from gpulaunch.model import JobSpec
from gpulaunch.plan.gpus import Gpu
from gpulaunch.plan.spec import StartOptions

UNCORRECTED = 1  # NVML_MEMORY_ERROR_TYPE_UNCORRECTED
VOLATILE = 0  # NVML_VOLATILE_ECC: since the driver loaded
ENABLED = 1  # NVML_FEATURE_ENABLED
XID_CRITICAL = 0x8  # nvmlEventTypeXidCriticalError


class UnhealthyGpuError(UnavailableError):
    """A GPU the job would use is not fit for it (exit 69)."""


@dataclass
class Gate:
    """NVML, open for the job's life: `check()` before the start and each restart."""

    nvml: Any
    gpus: tuple[Gpu, ...]
    allow_busy: bool = False
    _handles: dict[int, Any] = field(default_factory=dict)
    _events: Any = None
    xids: dict[int, list[int]] = field(default_factory=dict)  # GPU index -> XIDs seen
    energy_at_open: dict[int, int] = field(default_factory=dict)  # GPU index -> mJ

    @classmethod
    def open(cls, gpus: Sequence[Gpu], allow_busy: bool = False, nvml: Any = None) -> Gate | None:
        """The gate for `gpus`, or None where NVML cannot be had (nothing to check)."""
        if not gpus:
            return None
        try:
            nvml = start_nvml(nvml)
        except NvmlUnavailable:
            return None
        gate = cls(nvml, tuple(gpus), allow_busy)
        try:
            gate._events = nvml.nvmlEventSetCreate()
        except Exception:
            gate._events = None
        for gpu in gate.gpus:
            try:
                handle = nvml.nvmlDeviceGetHandleByPciBusId(gpu.bus_id.encode())
            except Exception as exc:
                if _lost(nvml, exc):
                    raise UnhealthyGpuError(gate._line(gpu, "the GPU is lost")) from None
                continue
            gate._handles[gpu.index] = handle
            energy = _optional(lambda h=handle: nvml.nvmlDeviceGetTotalEnergyConsumption(h))
            if isinstance(energy, int):
                gate.energy_at_open[gpu.index] = energy
            if gate._events is not None:
                try:
                    nvml.nvmlDeviceRegisterEvents(handle, XID_CRITICAL, gate._events)
                except Exception:
                    pass
        return gate

    def _line(self, gpu: Gpu, reason: str) -> str:
        return f"GPU {gpu.index} ({gpu.bus_id}) is not fit for the job: {reason}"

    def _call(self, fn: str, *args: Any) -> Any:
        return getattr(self.nvml, fn)(*args)

    def collect_xids(self) -> dict[int, list[int]]:
        """XIDs reported since the last look (never blocks): GPU index -> XIDs."""
        new: dict[int, list[int]] = {}
        if self._events is None:
            return new
        by_handle = {id(h): i for i, h in self._handles.items()}
        while True:
            try:
                data = self.nvml.nvmlEventSetWait(self._events, 0)
            except Exception:  # NVML_ERROR_TIMEOUT: none pending
                break
            index = by_handle.get(id(getattr(data, "device", None)))
            if index is None:
                continue
            xid = int(getattr(data, "eventData", 0))
            new.setdefault(index, []).append(xid)
            self.xids.setdefault(index, []).append(xid)
        return new

    def problems(self, own_pids: Iterable[int] = ()) -> list[str]:
        """One line per GPU that is not fit (the first reason found for it)."""
        ours = set(own_pids)
        xids = self.collect_xids()
        out = []
        for gpu in self.gpus:
            handle = self._handles.get(gpu.index)
            if handle is None:
                continue
            reason = self._reason(handle, ours, xids.get(gpu.index, []))
            if reason:
                out.append(self._line(gpu, reason))
        return out

    def _reason(self, handle: Any, ours: set[int], xids: list[int]) -> str | None:
        nvml = self.nvml
        try:
            if xids:
                return f"XID {', '.join(map(str, xids))} reported (see the kernel log: NVRM: Xid)"
            if not self.allow_busy:
                held = []
                for query in (
                    "nvmlDeviceGetComputeRunningProcesses",
                    "nvmlDeviceGetGraphicsRunningProcesses",
                ):
                    for proc in _optional(lambda q=query: self._call(q, handle)) or ():
                        if int(proc.pid) not in ours:
                            held.append(int(proc.pid))
                if held:
                    pids = ", ".join(map(str, sorted(set(held))))
                    return (
                        f"another process holds memory on it (pid {pids}); "
                        "--allow-busy-gpus starts anyway"
                    )
            ecc = _optional(lambda: nvml.nvmlDeviceGetTotalEccErrors(handle, UNCORRECTED, VOLATILE))
            if isinstance(ecc, int) and ecc > 0:
                return f"{ecc} uncorrected ECC error(s) since the driver loaded"
            pending = _optional(lambda: nvml.nvmlDeviceGetRetiredPagesPendingStatus(handle))
            if pending == ENABLED:
                return "retired pages are pending (the GPU needs a reset)"
            rows = _optional(lambda: nvml.nvmlDeviceGetRemappedRows(handle))
            if isinstance(rows, tuple) and len(rows) >= 4:
                if rows[2]:
                    return "rows are pending remapping (the GPU needs a reset)"
                if rows[3]:
                    return "a row remapping failed"
        except Exception as exc:
            if _lost(nvml, exc):
                return "the GPU is lost"
            raise
        return None

    def check(self, own_pids: Iterable[int] = ()) -> None:
        """UnhealthyGpuError naming the first GPU not fit; the others' lines follow it."""
        found = self.problems(own_pids)
        if found:
            raise UnhealthyGpuError(
                "; ".join(found),
                "use other GPUs (--gpus, or --gpus auto:N to lease fit ones), or have the "
                "GPU reset (nvidia-smi -r)",
            )

    def handle(self, index: int) -> Any:
        """NVML's handle of the job's GPU `index`, or None."""
        return self._handles.get(index)

    def close(self) -> None:
        try:
            if self._events is not None:
                self.nvml.nvmlEventSetFree(self._events)
            self.nvml.nvmlShutdown()
        except Exception:
            pass


def _lost(nvml: Any, exc: Exception) -> bool:
    lost = getattr(nvml, "NVML_ERROR_GPU_IS_LOST", 15)
    return getattr(exc, "value", None) == lost


def _optional(fn: Any) -> Any:
    """An NVML query; None where the GPU does not support it (or no permission). A lost GPU
    is raised: that is the answer."""
    try:
        return fn()
    except Exception as exc:
        if getattr(exc, "value", None) == 15:  # NVML_ERROR_GPU_IS_LOST
            raise
        return None


def open_gate(opts: StartOptions, spec: JobSpec) -> Gate | None:
    """The GPUs the ranks use, checked through NVML (this module); the gate stays open
    for the checks before each restart. None: no GPU, or no NVML to ask. A job that did
    not lease its GPUs (`--gpus 0,1`, `--nproc gpu`) is warned of GPUs other jobs lease."""
    from gpulaunch.plan.placement import Machine

    used = {rank.gpu for rank in spec.ranks if rank.gpu is not None}
    if not used:
        return None
    machine = Machine.fake(opts.machine_root) if opts.machine_root else Machine.this()
    gpus = [gpu for gpu in machine.inventory.gpus() if gpu.index in used]
    if opts.gpu_lease is None:
        from gpulaunch.leases.holders import holders

        held = holders(gpus, opts.machine_root)
        if held:
            print(
                "gpulaunch: warning: other jobs lease GPUs this job uses: "
                + "; ".join(h.describe() for h in held)
                + " (--gpus auto:N takes free ones)",
                file=sys.stderr,
                flush=True,
            )
    gate = Gate.open(gpus, allow_busy=opts.allow_busy_gpus)
    if gate is not None:
        try:
            gate.check()
        except GpulaunchError:
            gate.close()
            raise
    return gate
