"""Check 3: `--gpu-isolation` with the real driver.

In the rank's scope CUDA initialises and allocates (every node it needs is allowed:
the GPU's, nvidiactl, nvidia-uvm, nvidia-uvm-tools, nvidia-modeset, nvidia-caps as
present), and a /dev/nvidia<N> the rank was not given is refused with EPERM. Without a
second GPU, "not given" is a minor no GPU has, opened through a node made (before the
rank starts: the device cgroup also refuses mknod) in a tmpfs of its own under /run:
outside the scope the driver answers it (ENXIO/ENODEV), inside the device cgroup
refuses it first.

Two ways into such a scope: `gpulaunch start` (needs pystemd), and `systemd-run --scope`
with the DevicePolicy=/DeviceAllow= lines `gpulaunch render` prints (no pystemd: the
device rules are still proven on a machine where pystemd could not be installed).
"""

from __future__ import annotations

import errno
import sys
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from gpulaunch.plan.topology import normalize_pci_address
from tests.gpu.helpers import RANK, machine_gpus, report, run_outside, shared_nodes, unused_minor
from tests.gpu.helpers import start_argv as start
from tests.integration.jobs import GPULAUNCH, REPO, Job, assert_clean

pytestmark = pytest.mark.gpu


@pytest.fixture
def other_gpu(job: Job) -> Iterator[str]:
    """A node for a /dev/nvidia minor no GPU here has, in a tmpfs of its own (the box's
    /run and /tmp are nodev), made outside any scope; removed afterwards."""
    where = f"/run/gpulaunch-fakegpu-{job.id}"
    minor = unused_minor(machine_gpus())
    job.box.run(
        ["sh", "-c", f"mkdir {where} && mount -t tmpfs -o mode=0700,nosuid fakegpu {where} "
         f"&& mknod {where}/nvidia{minor} c 195 {minor}"],
        check=True,
    )  # fmt: skip
    yield f"{where}/nvidia{minor}"
    job.box.run(["sh", "-c", f"umount {where} && rmdir {where}"], check=True)


def probe_args(other_gpu: str) -> list[str]:
    gpu = machine_gpus()[0]
    return ["--open", ",".join([gpu.device, *shared_nodes(), other_gpu])]


def assert_isolated(inside: dict[str, Any], outside: dict[str, Any], other_gpu: str) -> None:
    gpu = machine_gpus()[0]
    assert outside["cuda_error"] is None, f"CUDA fails even outside a scope: {outside}"
    assert outside["opened"][other_gpu] != errno.EPERM, outside
    # Every node CUDA needs opens in the scope exactly as it does outside.
    needed = {p: e for p, e in inside["opened"].items() if p != other_gpu}
    assert needed == {p: e for p, e in outside["opened"].items() if p != other_gpu}, (
        inside["opened"],
        outside["opened"],
    )
    assert inside["opened"][gpu.device] == 0
    assert inside["opened"][other_gpu] == errno.EPERM, inside
    assert inside["cuda_error"] is None, inside["cuda_error"]
    assert inside["allocated_mib"] == 256
    assert [normalize_pci_address(b) for b in inside["bus_ids"]] == [gpu.bus_id]


def describe(inside: dict[str, Any], outside: dict[str, Any], other_gpu: str) -> str:
    def name(code: int) -> str:
        return errno.errorcode.get(code, "opened") if code else "opened"

    opened = ", ".join(f"{p}: {name(e)}" for p, e in inside["opened"].items() if p != other_gpu)
    return (
        f"in the scope: {opened}; unused minor: {name(inside['opened'][other_gpu])}"
        f" (outside: {name(outside['opened'][other_gpu])});"
        f" CUDA allocated {inside['allocated_mib']} MiB"
    )


def test_device_rules_with_systemd_run(
    job: Job, other_gpu: str, finding: Callable[[str], None]
) -> None:
    """The DeviceAllow= list gpulaunch renders lets CUDA work and refuses other GPUs."""
    args = probe_args(other_gpu)
    visible = {"CUDA_VISIBLE_DEVICES": machine_gpus()[0].cuda_id}  # as gpulaunch sets it
    outside = run_outside(job, args, env=visible)
    rendered = job.box.run(
        [GPULAUNCH, "render", "--job", job.id, "--gpu-isolation", "--nproc", "1", RANK],
        cwd=str(REPO), capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    rules = [ln for ln in rendered.splitlines() if ln.startswith(("DevicePolicy=", "DeviceAllow="))]
    assert rules[0] == "DevicePolicy=closed", rendered
    res = job.box.run(
        ["systemd-run", "--scope", "--quiet", f"--unit=gpulaunch-probe-{job.id}",
         *(f"--property={rule}" for rule in rules),
         "env", "RANK=0", *(f"{k}={v}" for k, v in visible.items()),
         sys.executable, RANK, "--dir", str(job.dir), "--mode", "probe", *args],
        cwd=str(REPO), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    inside = report(job, "rank0")
    assert_isolated(inside, outside, other_gpu)
    finding(describe(inside, outside, other_gpu))


@pytest.mark.gpu(needs=("pystemd",))
def test_gpu_isolation_job(job: Job, other_gpu: str, finding: Callable[[str], None]) -> None:
    """`gpulaunch start --gpu-isolation`: the rank gets its GPU by UUID, CUDA works in its
    scope, another minor is refused."""
    args = probe_args(other_gpu)
    outside = run_outside(job, args, env={"CUDA_VISIBLE_DEVICES": machine_gpus()[0].cuda_id})
    res = job.box.run(
        start(job, "--gpu-isolation", "--nproc", "1", mode="probe", script_args=args),
        cwd=str(REPO), capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    inside = report(job, "rank0")
    assert inside["cuda_visible_devices"] == machine_gpus()[0].uuid
    assert_isolated(inside, outside, other_gpu)
    assert_clean(job)
    finding(describe(inside, outside, other_gpu))
