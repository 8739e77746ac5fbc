"""--gpu-isolation with fake NVIDIA device nodes (mknod 195:N; no driver, so an allowed
open fails with ENXIO/ENODEV, a forbidden one with EPERM from the device cgroup) and a
fake GPU inventory (`--machine-root`, tests/fake_machine.py): as root each rank opens
only its own GPU; as an SSH user the device rules are not enforced (docs/environments.md)
and the start says so."""

from __future__ import annotations

import errno
import shlex

import pytest

from sdbox.vm import Machine
from tests.vm.vmjobs import VmJob, new_job

NODES = ("/dev/nvidia0", "/dev/nvidia1")
NO_DRIVER = {errno.ENXIO, errno.ENODEV}
MACHINE = (
    "import sys; sys.path.insert(0, '/src')\n"
    "from pathlib import Path\n"
    "from tests.fake_machine import FakeGpu, write_fake_machine\n"
    "write_fake_machine(Path(sys.argv[1]), [FakeGpu('0000:1b:00.0', 0, 'GPU-aaaa', 0),"
    " FakeGpu('0000:3d:00.0', 1, 'GPU-bbbb', 0)], online='0-1', nodes={0: '0-1'})\n"
)


@pytest.fixture(scope="module")
def gpu_nodes(vm: Machine) -> None:
    """/dev/nvidia0, /dev/nvidia1 and /dev/nvidiactl, openable by anyone (mode 666)."""
    made = "; ".join(
        f"test -e {path} || mknod -m 666 {path} c 195 {minor}"
        for path, minor in (("/dev/nvidia0", 0), ("/dev/nvidia1", 1), ("/dev/nvidiactl", 255))
    )
    vm.run(made, check=True)


def isolated_job(vm: Machine, user: str) -> tuple[VmJob, str]:
    job = new_job(vm, user, "gpuiso")
    machine = f"{job.dir}/machine"
    job.run(f"/opt/gpulaunch-venv/bin/python -c {shlex.quote(MACHINE)} {machine}")
    res = job.start(
        "--nproc", "2", "--gpus", "0,1", "--gpu-isolation", "--machine-root", machine,
        script_args=("--open", *NODES, "/dev/nvidiactl"),
    )  # fmt: skip
    assert res.returncode == 0, res.stdout
    return job, res.stdout


def test_gpu_isolation_as_root(vm: Machine, gpu_nodes: None) -> None:
    job, _ = isolated_job(vm, "root")
    for n in (0, 1):
        opened = job.rank(n)["open"]
        own, other = NODES[n], NODES[1 - n]
        assert opened[own] in NO_DRIVER, f"rank {n}: its own GPU node: {opened}"
        assert opened[other] == errno.EPERM, f"rank {n}: the other rank's node: {opened}"
        assert opened["/dev/nvidiactl"] in NO_DRIVER, opened


def test_gpu_isolation_as_ssh_user_is_not_enforced_and_said(vm: Machine, gpu_nodes: None) -> None:
    job, out = isolated_job(vm, "alice")
    assert "a user manager does not enforce --gpu-isolation's device rules" in out, out
    for n in (0, 1):
        opened = job.rank(n)["open"]
        assert set(opened.values()) <= NO_DRIVER, f"rank {n}: {opened}"  # no device rules
