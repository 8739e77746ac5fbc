"""Which NVIDIA GPUs this machine has, without importing torch (or initialising CUDA).

Two sources, tried in order, and only when a job asks for GPUs:

1. NVML through `pynvml` (the `nvidia-ml-py` package, the `gpu` extra), imported
   lazily: index, minor number, PCI bus id and UUID of every GPU;
2. the driver's /proc interface, `/proc/driver/nvidia/gpus/<bus id>/information`
   ("Device Minor:", "Bus Location:", "GPU UUID:"), when NVML is not installed or
   cannot start. Indices are then the PCI bus order, which is the order NVML and
   nvidia-smi use and CUDA's with `CUDA_DEVICE_ORDER=PCI_BUS_ID`.

A GPU's NUMA node comes from sysfs (`gpulaunch.plan.topology.pci_numa_node`). Its device
node is `/dev/nvidia<minor>`, character device 195:<minor> (the NVIDIA driver's fixed
major; `nvidiactl` is 195:255, `nvidia-modeset` 195:254).

The launcher's `CUDA_VISIBLE_DEVICES` is the pool ranks choose from (`visible_pool`):
indices and `GPU-<uuid>` names (a unique prefix will do) are read as CUDA reads them,
up to the first entry that names no GPU.

Tests inject GPUs with `StaticInventory` or point `ProcInventory` at a fake tree; both
are stand-ins for a machine with GPUs, not ways to run jobs.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from gpulaunch.base.nvml import NvmlUnavailable, start_nvml
from gpulaunch.errors import UsageError
from gpulaunch.numberlist import parse_number_list
from gpulaunch.plan.bounds import MAX_GPU
from gpulaunch.plan.topology import SYSFS, normalize_pci_address, pci_numa_node

NVIDIA_MAJOR = 195  # the NVIDIA driver's character major (Documentation/admin-guide/devices.txt)
NVIDIACTL_MINOR = 255
NVIDIA_MODESET_MINOR = 254


@dataclass(frozen=True)
class Gpu:
    """One GPU: `index` in NVML's (nvidia-smi's) numbering, `minor` of /dev/nvidia<minor>."""

    index: int
    minor: int
    bus_id: str  # as sysfs names it: "0000:3b:00.0"
    uuid: str | None = None  # "GPU-8e6b2e1a-..." where known
    numa_node: int | None = None  # None: not known

    @property
    def device(self) -> str:
        """Its device node."""
        return f"/dev/nvidia{self.minor}"

    @property
    def cgroup_device(self) -> str:
        """Its node as a DeviceAllow= path that needs no node in /dev (docs/systemd-facts.md)."""
        return f"/dev/char/{NVIDIA_MAJOR}:{self.minor}"

    @property
    def cuda_id(self) -> str:
        """How CUDA_VISIBLE_DEVICES names it: the UUID where known, else the index."""
        return self.uuid or str(self.index)


class Inventory(Protocol):
    """Where GPUs come from; `gpus()` is called at most once per job, and only if needed."""

    def gpus(self) -> tuple[Gpu, ...]: ...


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def nvml_gpus(nvml: Any = None, sysfs: Path = SYSFS) -> tuple[Gpu, ...] | None:
    """The GPUs NVML sees; None when `pynvml` is missing or NVML cannot start.

    `nvml` is the pynvml module (imported here when not given; tests pass a stand-in).
    """
    try:
        nvml = start_nvml(nvml)
    except NvmlUnavailable:
        return None
    try:
        gpus = []
        for index in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            bus_id = normalize_pci_address(_text(nvml.nvmlDeviceGetPciInfo(handle).busId))
            gpus.append(
                Gpu(
                    index=index,
                    minor=int(nvml.nvmlDeviceGetMinorNumber(handle)),
                    bus_id=bus_id,
                    uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
                    numa_node=pci_numa_node(bus_id, sysfs),
                )
            )
        return tuple(gpus)
    except Exception:  # a GPU NVML cannot query: let the /proc interface answer
        return None
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception:
            pass


def _fields(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            out[key.strip()] = value.strip()
    return out


def proc_gpus(proc: Path = Path("/proc"), sysfs: Path = SYSFS) -> tuple[Gpu, ...] | None:
    """The GPUs the driver lists in /proc/driver/nvidia/gpus; None without that directory.

    GPUs the driver excludes ("GPU Excluded: Yes") are left out.
    """
    top = proc / "driver/nvidia/gpus"
    if not top.is_dir():
        return None
    found = []
    for info in top.glob("*/information"):
        try:
            fields = _fields(info.read_text())
            minor = int(fields["Device Minor"])
            bus_id = normalize_pci_address(fields.get("Bus Location") or info.parent.name)
        except (OSError, KeyError, ValueError):
            continue
        if fields.get("GPU Excluded", "").lower() == "yes":
            continue
        uuid = fields.get("GPU UUID", "")
        found.append((bus_id, minor, uuid if re.fullmatch(r"GPU-[0-9a-fA-F-]+", uuid) else None))
    return tuple(
        Gpu(index=i, minor=minor, bus_id=bus_id, uuid=uuid, numa_node=pci_numa_node(bus_id, sysfs))
        for i, (bus_id, minor, uuid) in enumerate(sorted(found))
    )


class MachineInventory:
    """This machine's GPUs: NVML if it works, else the driver's /proc interface."""

    def __init__(
        self, proc: Path = Path("/proc"), sysfs: Path = SYSFS, *, use_nvml: bool = True
    ) -> None:
        """`use_nvml=False` with fake `proc`/`sysfs` trees is the tests' stand-in machine."""
        self.proc = proc
        self.sysfs = sysfs
        self.use_nvml = use_nvml

    def gpus(self) -> tuple[Gpu, ...]:
        found = nvml_gpus(sysfs=self.sysfs) if self.use_nvml else None
        if found is None:
            found = proc_gpus(self.proc, self.sysfs)
        return found or ()


@dataclass(frozen=True)
class StaticInventory:
    """A fixed list of GPUs: a stand-in for tests, never used for real jobs."""

    fixed: tuple[Gpu, ...]

    def gpus(self) -> tuple[Gpu, ...]:
        return self.fixed


def visible_pool(gpus: Sequence[Gpu], cuda_visible_devices: str | None) -> tuple[Gpu, ...]:
    """The GPUs `CUDA_VISIBLE_DEVICES` leaves visible, in its order (all when it is unset).

    As CUDA reads it: comma-separated indices or `GPU-<uuid>` (or a unique prefix of one);
    the first entry that names no GPU ends the list (so "-1" hides every GPU). MIG
    devices and an entry given twice are refused.
    """
    if cuda_visible_devices is None:
        return tuple(gpus)
    pool: list[Gpu] = []
    for raw in cuda_visible_devices.split(","):
        entry = raw.strip()
        if entry.startswith("MIG-"):
            raise UsageError(
                f"CUDA_VISIBLE_DEVICES names a MIG device ({entry}); gpulaunch places ranks "
                "on whole GPUs only",
                "name whole GPUs in CUDA_VISIBLE_DEVICES, or unset it",
            )
        gpu: Gpu | None = None
        if re.fullmatch(r"[0-9]+", entry):
            gpu = next((g for g in gpus if g.index == int(entry)), None)
        elif entry.startswith("GPU-"):
            matches = [g for g in gpus if g.uuid and g.uuid.lower().startswith(entry.lower())]
            gpu = matches[0] if len(matches) == 1 else None
        if gpu is None:
            break
        if gpu in pool:
            raise UsageError(
                f"CUDA_VISIBLE_DEVICES={cuda_visible_devices} names GPU {gpu.index} twice"
            )
        pool.append(gpu)
    return tuple(pool)


def parse_gpu_list(text: str) -> tuple[int, ...]:
    """`--gpus`: "0,2,3" or "0-3" (positions in the pool), in the order given."""
    out: list[int] = []
    for index in parse_number_list(text, "GPU number", most=MAX_GPU):
        if index in out:
            raise ValueError(f"GPU {index} is named twice")
        out.append(index)
    return tuple(out)
