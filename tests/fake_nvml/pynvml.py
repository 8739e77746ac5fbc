"""A stand-in `pynvml` for tests: the GPUs and their state from the JSON file named by
$GPULAUNCH_TEST_NVML (read at nvmlInit), keyed by PCI bus id ("0000:1b:00.0"):

    {"0000:1b:00.0": {"minor": 0, "uuid": "GPU-...", "processes": [[pid, bytes]],
                      "ecc": 0, "pending_pages": false, "remapped_rows": [0, 0, false, false],
                      "lost": false, "xids": [79], "energy_mj": 1000,
                      "energy_step_mj": 0,
                      "accounting": {"pid" or "*": [max_memory_bytes, utilisation_percent]}}}

Put tests/fake_nvml first on PYTHONPATH of a gpulaunch process to give it these GPUs.
`xids` are delivered once each through the event API, as NVML does after registration.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_NOT_SUPPORTED = 3
NVML_FEATURE_ENABLED = 1
nvmlEventTypeXidCriticalError = 0x8

_state: dict[str, dict[str, Any]] = {}
_delivered: set[tuple[str, int]] = set()


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(f"NVML error {value}")
        self.value = value


@dataclass
class _Handle:
    bus: str
    index: int


@dataclass
class _Proc:
    pid: int
    usedGpuMemory: int


@dataclass
class _Event:
    device: _Handle
    eventType: int
    eventData: int


@dataclass
class _Pci:
    busId: bytes


@dataclass
class _Stats:
    maxMemoryUsage: int
    gpuUtilization: int


_handles: dict[str, _Handle] = {}


def nvmlInit() -> None:
    path = os.environ.get("GPULAUNCH_TEST_NVML")
    if not path:
        raise NVMLError(9)  # NVML_ERROR_DRIVER_NOT_LOADED
    if _state:  # loaded once per process: counters go on across nvmlInit/nvmlShutdown
        return
    with open(path) as f:
        _state.update(json.load(f))
    for i, bus in enumerate(sorted(_state)):
        _handles[bus] = _Handle(bus, i)


def nvmlShutdown() -> None:
    pass


def _gpu(handle: _Handle) -> dict[str, Any]:
    gpu = _state[handle.bus]
    if gpu.get("lost"):
        raise NVMLError(NVML_ERROR_GPU_IS_LOST)
    return gpu


def nvmlDeviceGetCount() -> int:
    return len(_handles)


def nvmlDeviceGetHandleByIndex(index: int) -> _Handle:
    return sorted(_handles.values(), key=lambda h: h.index)[index]


def nvmlDeviceGetHandleByPciBusId(bus: bytes | str) -> _Handle:
    key = bus.decode() if isinstance(bus, bytes) else bus
    handle = _handles.get(key.lower()[-12:].rjust(12, "0"))
    if handle is None:
        raise NVMLError(6)  # NVML_ERROR_NOT_FOUND
    _gpu(handle)
    return handle


def nvmlDeviceGetPciInfo(handle: _Handle) -> _Pci:
    return _Pci(handle.bus.encode())


def nvmlDeviceGetMinorNumber(handle: _Handle) -> int:
    return int(_gpu(handle).get("minor", handle.index))


def nvmlDeviceGetUUID(handle: _Handle) -> str:
    return str(_gpu(handle).get("uuid", f"GPU-{handle.index:08x}-0000-0000-0000-000000000000"))


def nvmlDeviceGetComputeRunningProcesses(handle: _Handle) -> list[_Proc]:
    return [_Proc(pid, mem) for pid, mem in _gpu(handle).get("processes", [])]


def nvmlDeviceGetGraphicsRunningProcesses(handle: _Handle) -> list[_Proc]:
    return []


def nvmlDeviceGetTotalEccErrors(handle: _Handle, kind: int, counter: int) -> int:
    return int(_gpu(handle).get("ecc", 0))


def nvmlDeviceGetRetiredPagesPendingStatus(handle: _Handle) -> int:
    return 1 if _gpu(handle).get("pending_pages") else 0


def nvmlDeviceGetRemappedRows(handle: _Handle) -> tuple[int, int, bool, bool]:
    rows = _gpu(handle).get("remapped_rows")
    if rows is None:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    return tuple(rows)  # type: ignore[return-value]


def nvmlDeviceGetTotalEnergyConsumption(handle: _Handle) -> int:
    """`energy_mj`, and `energy_step_mj` more at every read."""
    gpu = _gpu(handle)
    gpu["energy_mj"] = int(gpu.get("energy_mj", 0)) + int(gpu.get("energy_step_mj", 0))
    return int(gpu["energy_mj"]) - int(gpu.get("energy_step_mj", 0))


def nvmlDeviceGetAccountingMode(handle: _Handle) -> int:
    return 1 if "accounting" in _gpu(handle) else 0


def nvmlDeviceGetAccountingStats(handle: _Handle, pid: int) -> _Stats:
    accounting = _gpu(handle).get("accounting", {})
    found = accounting.get(str(pid), accounting.get("*"))
    if found is None:
        raise NVMLError(6)
    return _Stats(*found)


def nvmlEventSetCreate() -> list[_Handle]:
    return []


def nvmlDeviceRegisterEvents(handle: _Handle, kinds: int, events: list[_Handle]) -> None:
    events.append(handle)


def nvmlEventSetWait(events: list[_Handle], timeout_ms: int) -> _Event:
    """Each XID once; `xids` are read from the file again (a test adds some during a run)."""
    with open(os.environ["GPULAUNCH_TEST_NVML"]) as f:
        for bus, gpu in json.load(f).items():
            if bus in _state and gpu.get("xids"):
                _state[bus]["xids"] = sorted({*_state[bus].get("xids", []), *gpu["xids"]})
    for handle in events:
        for xid in _state[handle.bus].get("xids", []):
            if (handle.bus, xid) not in _delivered:
                _delivered.add((handle.bus, xid))
                return _Event(handle, nvmlEventTypeXidCriticalError, xid)
    raise NVMLError(NVML_ERROR_TIMEOUT)


def nvmlEventSetFree(events: list[_Handle]) -> None:
    events.clear()
