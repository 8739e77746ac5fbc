"""A stand-in machine for tests: fake /proc/driver/nvidia and /sys trees under a directory.

`gpulaunch --machine-root DIR` (hidden, for tests only) and `placement.Machine.fake`
read GPUs from DIR/proc and CPUs, NUMA nodes and PCI localities from DIR/sys.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class FakeGpu:
    """A GPU as the driver's /proc interface and sysfs show it."""

    bus_id: str  # "0000:3b:00.0"
    minor: int
    uuid: str | None = None
    numa_node: int = -1
    excluded: bool = False


def write_fake_machine(
    root: Path,
    gpus: Sequence[FakeGpu] = (),
    *,
    online: str = "0-7",
    nodes: Mapping[int, str] | None = None,
    siblings: Mapping[int, str] | None = None,
) -> Path:
    """Write the trees under `root` and return it.

    `nodes` maps NUMA node numbers to CPU lists (none: no NUMA information); `siblings`
    maps CPUs to their thread_siblings_list.
    """
    for gpu in gpus:
        info = root / "proc/driver/nvidia/gpus" / gpu.bus_id / "information"
        info.parent.mkdir(parents=True, exist_ok=True)
        uuid = gpu.uuid or "GPU-????????-????-????-????-????????????"
        info.write_text(
            "Model: \t\t NVIDIA Fake\n"
            "IRQ:   \t\t 42\n"
            f"GPU UUID: \t {uuid}\n"
            "Video BIOS: \t ??.??.??.??.??\n"
            "Bus Type: \t PCIe\n"
            "DMA Size: \t 47 bits\n"
            "DMA Mask: \t 0x7fffffffffff\n"
            f"Bus Location: \t {gpu.bus_id}\n"
            f"Device Minor: \t {gpu.minor}\n"
            f"GPU Excluded:\t {'Yes' if gpu.excluded else 'No'}\n"
        )
        pci = root / "sys/bus/pci/devices" / gpu.bus_id
        pci.mkdir(parents=True, exist_ok=True)
        (pci / "numa_node").write_text(f"{gpu.numa_node}\n")
    cpu_dir = root / "sys/devices/system/cpu"
    cpu_dir.mkdir(parents=True, exist_ok=True)
    (cpu_dir / "online").write_text(online + "\n")
    for cpu, text in (siblings or {}).items():
        topo = cpu_dir / f"cpu{cpu}/topology"
        topo.mkdir(parents=True, exist_ok=True)
        (topo / "thread_siblings_list").write_text(text + "\n")
    for node, text in (nodes or {}).items():
        node_dir = root / f"sys/devices/system/node/node{node}"
        node_dir.mkdir(parents=True, exist_ok=True)
        (node_dir / "cpulist").write_text(text + "\n")
    return root


def smt2_siblings(cores: int) -> dict[int, str]:
    """Core c has the threads c and c+cores (Linux's usual numbering with SMT)."""
    return {cpu: f"{cpu % cores},{cpu % cores + cores}" for cpu in range(2 * cores)}


def four_gpu_machine(root: Path) -> Path:
    """4 GPUs (2 per NUMA node), 16 CPUs: 8 cores with 2 threads, nodes 0-3,8-11 and 4-7,12-15."""
    return write_fake_machine(
        root,
        [
            FakeGpu("0000:1b:00.0", 0, "GPU-00000000-1111-2222-3333-000000000000", 0),
            FakeGpu("0000:3d:00.0", 1, "GPU-00000001-1111-2222-3333-000000000001", 0),
            # minors need not follow the PCI order
            FakeGpu("0000:89:00.0", 3, "GPU-00000002-1111-2222-3333-000000000002", 1),
            FakeGpu("0000:b2:00.0", 2, "GPU-00000003-1111-2222-3333-000000000003", 1),
        ],
        online="0-15",
        nodes={0: "0-3,8-11", 1: "4-7,12-15"},
        siblings=smt2_siblings(8),
    )
