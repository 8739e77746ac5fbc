"""GPU inventory: NVML through a stand-in module, the driver's /proc interface from fake trees,
CUDA_VISIBLE_DEVICES as the pool, --gpus lists."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from gpulaunch.errors import UsageError
from gpulaunch.plan.gpus import (
    Gpu,
    MachineInventory,
    StaticInventory,
    nvml_gpus,
    parse_gpu_list,
    proc_gpus,
    visible_pool,
)
from tests.fake_machine import FakeGpu, write_fake_machine

UUIDS = [f"GPU-{i:08x}-aaaa-bbbb-cccc-{i:012x}" for i in range(4)]


@dataclass
class _PciInfo:
    busId: bytes  # NVML's field name


class StandInNvml:
    """A stand-in for the pynvml module: what gpus.py calls, over a fixed list of GPUs."""

    class NVMLError(Exception):
        pass

    def __init__(self, gpus: list[tuple[str, int, str]], *, fail: str | None = None) -> None:
        self.gpus = gpus  # (NVML bus id, minor, uuid)
        self.fail = fail
        self.shut_down = False

    def nvmlInit(self) -> None:
        if self.fail == "init":
            raise self.NVMLError("NVML Shared Library Not Found")

    def nvmlShutdown(self) -> None:
        self.shut_down = True

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        if self.fail == "handle":
            raise self.NVMLError("GPU is lost")
        return index

    def nvmlDeviceGetPciInfo(self, handle: int) -> _PciInfo:
        return _PciInfo(self.gpus[handle][0].encode())  # old pynvml versions return bytes

    def nvmlDeviceGetMinorNumber(self, handle: int) -> int:
        return self.gpus[handle][1]

    def nvmlDeviceGetUUID(self, handle: int) -> str:
        return self.gpus[handle][2]


def test_nvml_inventory(tmp_path: Path) -> None:
    write_fake_machine(tmp_path, [FakeGpu("0000:3b:00.0", 1, numa_node=1)])
    nvml = StandInNvml([("00000000:1B:00.0", 0, UUIDS[0]), ("00000000:3B:00.0", 1, UUIDS[1])])
    gpus = nvml_gpus(nvml, tmp_path / "sys")
    assert gpus == (
        Gpu(index=0, minor=0, bus_id="0000:1b:00.0", uuid=UUIDS[0], numa_node=None),
        Gpu(index=1, minor=1, bus_id="0000:3b:00.0", uuid=UUIDS[1], numa_node=1),
    )
    assert nvml.shut_down


@pytest.mark.parametrize("fail", ["init", "handle"])
def test_nvml_failures_mean_no_answer(tmp_path: Path, fail: str) -> None:
    nvml = StandInNvml([("00000000:1B:00.0", 0, UUIDS[0])], fail=fail)
    assert nvml_gpus(nvml, tmp_path) is None


def test_real_pynvml_without_a_driver_is_no_answer_not_an_error() -> None:
    """The real module: on a machine without the driver NVML cannot start (None)."""
    pytest.importorskip("pynvml")
    found = nvml_gpus()
    assert found is None or all(isinstance(gpu, Gpu) for gpu in found)


def test_proc_inventory(tmp_path: Path) -> None:
    write_fake_machine(
        tmp_path,
        [
            FakeGpu("0000:b2:00.0", 2, UUIDS[3], numa_node=1),
            FakeGpu("0000:1b:00.0", 0, UUIDS[0], numa_node=0),
            FakeGpu("0000:3d:00.0", 1, None, numa_node=-1),  # UUID shown as GPU-????...
            FakeGpu("0000:89:00.0", 3, UUIDS[2], numa_node=1, excluded=True),
        ],
    )
    gpus = proc_gpus(tmp_path / "proc", tmp_path / "sys")
    # indices in PCI bus order, as NVML and CUDA_DEVICE_ORDER=PCI_BUS_ID number them
    assert gpus == (
        Gpu(index=0, minor=0, bus_id="0000:1b:00.0", uuid=UUIDS[0], numa_node=0),
        Gpu(index=1, minor=1, bus_id="0000:3d:00.0", uuid=None, numa_node=None),
        Gpu(index=2, minor=2, bus_id="0000:b2:00.0", uuid=UUIDS[3], numa_node=1),
    )
    assert gpus[2].device == "/dev/nvidia2"
    assert gpus[2].cgroup_device == "/dev/char/195:2"
    assert gpus[2].cuda_id == UUIDS[3] and gpus[1].cuda_id == "1"


def test_proc_inventory_skips_unreadable_entries(tmp_path: Path) -> None:
    broken = tmp_path / "proc/driver/nvidia/gpus/0000:01:00.0/information"
    broken.parent.mkdir(parents=True)
    broken.write_text("Model: something\n")  # no Device Minor
    assert proc_gpus(tmp_path / "proc", tmp_path / "sys") == ()


def test_no_driver_no_gpus(tmp_path: Path) -> None:
    assert proc_gpus(tmp_path / "proc", tmp_path / "sys") is None
    assert MachineInventory(tmp_path / "proc", tmp_path / "sys", use_nvml=False).gpus() == ()


def test_machine_inventory_stand_in(tmp_path: Path) -> None:
    write_fake_machine(tmp_path, [FakeGpu("0000:1b:00.0", 0, UUIDS[0], numa_node=0)])
    gpus = MachineInventory(tmp_path / "proc", tmp_path / "sys", use_nvml=False).gpus()
    assert [(g.index, g.minor, g.numa_node) for g in gpus] == [(0, 0, 0)]


def four() -> tuple[Gpu, ...]:
    return StaticInventory(
        tuple(Gpu(i, minor=i, bus_id=f"0000:{i + 1:02x}:00.0", uuid=UUIDS[i]) for i in range(4))
    ).gpus()


@pytest.mark.parametrize(
    ("visible", "indices"),
    [
        (None, [0, 1, 2, 3]),
        ("", []),
        ("2,0", [2, 0]),
        (" 3 , 1 ", [3, 1]),
        ("1,7,2", [1]),  # CUDA stops at the first entry that names no GPU
        ("-1", []),
        (UUIDS[2], [2]),
        (f"{UUIDS[3]},0", [3, 0]),
        (UUIDS[1][:13], [1]),  # a unique prefix: GPU-00000001
        ("GPU-0000000", []),  # ambiguous prefix
        ("GPU-ffffffff", []),
        ("cuda0", []),
    ],
)
def test_visible_pool(visible: str | None, indices: list[int]) -> None:
    assert [gpu.index for gpu in visible_pool(four(), visible)] == indices


def test_visible_pool_refuses_mig_and_duplicates() -> None:
    with pytest.raises(UsageError, match="MIG device"):
        visible_pool(four(), "MIG-1f2e3d4c-0000-0000-0000-000000000000")
    with pytest.raises(UsageError, match="names GPU 1 twice"):
        visible_pool(four(), f"1,{UUIDS[1]}")


@pytest.mark.parametrize(
    ("text", "gpus"),
    [
        ("0", (0,)),
        ("0,2,3", (0, 2, 3)),
        ("3,1", (3, 1)),
        ("0-3", (0, 1, 2, 3)),
        ("4,0-1", (4, 0, 1)),
    ],
)
def test_parse_gpu_list(text: str, gpus: tuple[int, ...]) -> None:
    assert parse_gpu_list(text) == gpus


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("", "'' is not a GPU number"),
        ("a", "'a' is not a GPU number"),
        ("-1", "'-1' is not a GPU number"),
        ("3-1", "backwards"),
        ("0,1,0", "GPU 0 is named twice"),
        ("0-2,1", "GPU 1 is named twice"),
    ],
)
def test_parse_gpu_list_errors(text: str, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        parse_gpu_list(text)
