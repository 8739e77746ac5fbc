"""Check 1: gpulaunch's GPU inventory against nvidia-smi and the driver, on real hardware.

No job runs here: NVML, /proc/driver/nvidia, sysfs, `gpulaunch render` and libcuda.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from gpulaunch.plan.gpus import Gpu, nvml_gpus, proc_gpus, visible_pool
from gpulaunch.plan.topology import normalize_pci_address, parse_cpu_list
from tests.gpu import nvsmi
from tests.gpu.helpers import RANK, machine_gpus, run_outside
from tests.integration.jobs import GPULAUNCH, REPO, Job

pytestmark = pytest.mark.gpu


def as_smi(gpus: tuple[Gpu, ...]) -> list[tuple[int, str | None, str]]:
    return [(g.index, g.uuid, g.bus_id) for g in gpus]


def smi_rows() -> list[tuple[int, str | None, str]]:
    return [(g.index, g.uuid, normalize_pci_address(g.bus_id)) for g in nvsmi.gpus()]


def test_nvml_inventory_equals_nvidia_smi(finding: Callable[[str], None]) -> None:
    """NVML's GPUs (index, UUID, PCI bus id) are nvidia-smi's."""
    gpus = nvml_gpus()
    assert gpus is not None, "NVML did not answer (pynvml missing, or nvmlInit failed)"
    assert as_smi(gpus) == smi_rows()
    finding(", ".join(f"GPU {g.index} {g.bus_id} minor {g.minor} {g.uuid}" for g in gpus))


def test_proc_inventory_equals_nvidia_smi(finding: Callable[[str], None]) -> None:
    """The /proc/driver/nvidia fallback finds the same GPUs, in nvidia-smi's order."""
    gpus = proc_gpus()
    assert gpus is not None, "no /proc/driver/nvidia/gpus"
    nvml = nvml_gpus()
    smi = smi_rows()
    assert [(g.index, g.bus_id) for g in gpus] == [(i, bus) for i, _, bus in smi]
    with_uuid = [g for g in gpus if g.uuid is not None]
    assert [(g.index, g.uuid) for g in with_uuid] == [(i, u) for i, u, _ in smi if u][
        : len(with_uuid)
    ] or not with_uuid
    if nvml is not None:
        assert [g.minor for g in gpus] == [g.minor for g in nvml]
    finding(f"/proc gives UUIDs: {'yes' if len(with_uuid) == len(gpus) else 'no'}")


def test_numa_node_from_sysfs(job: Job, finding: Callable[[str], None]) -> None:
    """Each GPU's NUMA node is sysfs's, and `--cpu-bind numa` keeps rank 0 on it."""
    for gpu in machine_gpus():
        raw = Path(f"/sys/bus/pci/devices/{gpu.bus_id}/numa_node").read_text().strip()
        expected = int(raw) if int(raw) >= 0 else None
        assert gpu.numa_node == expected
        finding(f"GPU {gpu.index}: numa_node {raw}")
    gpu = machine_gpus()[0]
    res = job.box.run(
        [GPULAUNCH, "render", "--job", job.id, "--gpus", "0", "--cpu-bind", "numa", RANK],
        cwd=str(REPO), capture_output=True, text=True,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    allowed = [ln.split("=", 1)[1] for ln in res.stdout.splitlines() if ln.startswith("Allowed")]
    assert len(allowed) == 1, res.stdout
    if gpu.numa_node is not None:
        node = Path(f"/sys/devices/system/node/node{gpu.numa_node}/cpulist").read_text()
        assert set(parse_cpu_list(allowed[0])) <= set(parse_cpu_list(node))
    finding(f"--cpu-bind numa: rank 0 AllowedCPUs={allowed[0]}")


@pytest.mark.parametrize("form", ["index", "uuid", "uuid-prefix", "hidden"])
def test_cuda_visible_devices(job: Job, form: str, finding: Callable[[str], None]) -> None:
    """CUDA_VISIBLE_DEVICES as indices and UUIDs: gpulaunch's pool is the GPU CUDA sees."""
    gpu = machine_gpus()[-1]
    assert gpu.uuid is not None
    value = {
        "index": str(gpu.index),
        "uuid": gpu.uuid,
        "uuid-prefix": gpu.uuid[:12],
        "hidden": "-1",
    }[form]
    pool = visible_pool(machine_gpus(), value)
    cuda = run_outside(job, ["--alloc-mib", "0"], env={"CUDA_VISIBLE_DEVICES": value})
    assert cuda["cuda_error"] is None or form == "hidden", cuda
    if form == "hidden":
        assert pool == ()
        return
    assert pool == (gpu,)
    assert cuda["device_count"] == 1
    assert normalize_pci_address(cuda["bus_ids"][0]) == gpu.bus_id
    # What gpulaunch hands the rank names the same GPU.
    res = job.box.run(
        ["env", f"CUDA_VISIBLE_DEVICES={value}", GPULAUNCH, "render", "--job", job.id,
         "--gpus", "0", RANK],
        cwd=str(REPO), capture_output=True, text=True,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert f"(GPU {gpu.index})" in res.stdout
    finding(f"CUDA_VISIBLE_DEVICES={value}: CUDA sees {cuda['bus_ids'][0]}")
