"""GPU use per process through NVML (`pynvml`, the `gpu` extra): optional.

`open_gpus()` gives a `Gpus` reader, or the reason there is none (no pynvml, no
driver): the table says that reason once. Every NVML call that fails for one
device or one process leaves that number unknown; it never becomes 0.

- live (`gpulaunch top`): per process, the GPU memory it holds
  (`nvmlDeviceGetComputeRunningProcesses` and `...GraphicsRunningProcesses`) and
  its SM utilisation over the last sampling window (`nvmlDeviceGetProcessUtilization`);
- at a rank's end (the report): its processes' peak GPU memory from NVML's
  accounting (`nvmlDeviceGetAccountingStats`), where accounting mode is on
  (`nvidia-smi -am 1`, root); otherwise unknown.

PIDs are the kernel's as NVML sees them: inside a PID namespace other than the
driver's they do not match, and the columns stay empty.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from gpulaunch.base.nvml import NvmlUnavailable, start_nvml


@dataclass(frozen=True)
class GpuProcess:
    """One process's use of one GPU."""

    gpu: int
    memory: int | None  # bytes; None where NVML cannot tell (e.g. without permission)
    sm_util: int | None  # percent, over NVML's last sampling window


def gpu_use(
    pids: Iterable[int], on_gpu: dict[int, list[GpuProcess]]
) -> tuple[int | None, int | None]:
    """The GPU memory (sum) and SM utilisation (sum over its processes) of a rank's pids."""
    memory: int | None = None
    util: int | None = None
    for pid in pids:
        for use in on_gpu.get(pid, ()):
            if use.memory is not None:
                memory = (memory or 0) + use.memory
            if use.sm_util is not None:
                util = (util or 0) + use.sm_util
    return memory, util


class Gpus:
    """NVML, initialised; `close()` shuts it down."""

    def __init__(self, nvml: Any) -> None:
        self.nvml = nvml
        self.count = int(nvml.nvmlDeviceGetCount())
        self._handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(self.count)]

    def processes(self) -> dict[int, list[GpuProcess]]:
        """Every process on every GPU: pid -> its use of each GPU it is on."""
        out: dict[int, list[GpuProcess]] = {}
        for index, handle in enumerate(self._handles):
            memory: dict[int, int | None] = {}
            for query in (
                "nvmlDeviceGetComputeRunningProcesses",
                "nvmlDeviceGetGraphicsRunningProcesses",
            ):
                for proc in self._call(getattr(self.nvml, query), handle) or ():
                    used = getattr(proc, "usedGpuMemory", None)
                    memory[int(proc.pid)] = int(used) if isinstance(used, int) else None
            util = self._utilisation(handle)
            for pid in memory.keys() | util.keys():
                out.setdefault(pid, []).append(
                    GpuProcess(gpu=index, memory=memory.get(pid), sm_util=util.get(pid))
                )
        return out

    def _utilisation(self, handle: Any) -> dict[int, int]:
        """Each process's newest SM utilisation sample in NVML's buffer (the last seconds)."""
        samples = self._call(self.nvml.nvmlDeviceGetProcessUtilization, handle, 0) or ()
        newest: dict[int, tuple[int, int]] = {}
        for s in samples:
            stamp = int(s.timeStamp)
            if stamp >= newest.get(int(s.pid), (-1, 0))[0]:
                newest[int(s.pid)] = (stamp, int(s.smUtil))
        return {pid: util for pid, (_, util) in newest.items()}

    def peak_memory(self, pids: Iterable[int]) -> int | None:
        """Peak GPU memory of these processes over their lives (accounting mode), or None."""
        wanted = set(pids)
        total, known = 0, False
        for handle in self._handles:
            mode = self._call(self.nvml.nvmlDeviceGetAccountingMode, handle)
            if mode != getattr(self.nvml, "NVML_FEATURE_ENABLED", 1):
                continue
            for pid in wanted:
                stats = self._call(self.nvml.nvmlDeviceGetAccountingStats, handle, pid)
                used = getattr(stats, "maxMemoryUsage", None)
                if isinstance(used, int):
                    total += used
                    known = True
        return total if known else None

    def _call(self, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except Exception:  # pynvml.NVMLError: not supported, no permission, not found, ...
            return None

    def close(self) -> None:
        try:
            self.nvml.nvmlShutdown()
        except Exception:
            pass


def open_gpus(nvml: Any = None) -> Gpus | str:
    """NVML ready to read, or why not (`nvml`: the pynvml module; tests pass a stand-in)."""
    try:
        nvml = start_nvml(nvml)
    except NvmlUnavailable as exc:
        return str(exc)
    try:
        gpus = Gpus(nvml)
    except Exception as exc:
        try:
            nvml.nvmlShutdown()
        except Exception:
            pass
        return f"NVML: {exc}"
    if gpus.count == 0:
        gpus.close()
        return "NVML sees no GPU"
    return gpus
