"""gpulaunch in a real container (podman, root, no registry: `--rootfs` of a copy of the
VM's system), the direct supervisor chosen by itself (no systemd inside):

- with its own cgroup namespace and a writable cgroup2: the cgroup way, `--memory-max`
  enforced and the OOM kill named;
- with podman's default read-only cgroup: the process-group way, the limit not
  enforced and the start says so (docs/environments.md), the rank runs to its end.
"""

from __future__ import annotations

import shlex

import pytest

from sdbox.vm import Machine
from tests.vm.vmjobs import RANK, new_job

PODMAN = ["podman", "run", "--rm", "--network", "host", "--cgroupns=private",
          "-v", "/src:/src", "-v", "/var/tmp/vmt:/var/tmp/vmt", "-w", "/var/tmp"]  # fmt: skip
ROOTFS = ["--rootfs", "/var/lib/sdbox-ct"]
RW_CGROUP = ["--systemd=always"]  # podman mounts cgroup2 read-write for it


@pytest.mark.parametrize("cgroup", ["rw", "ro"])
def test_memory_max_in_a_container(vm: Machine, cgroup: str) -> None:
    job = new_job(vm, "root", f"ct{cgroup}")
    argv = [*PODMAN, *(RW_CGROUP if cgroup == "rw" else []), *ROOTFS,
            "gpulaunch", "start", "--job", job.id, "--nproc", "1", "--memory-max", "150M",
            RANK, "--dir", job.dir, "--hog-rank", "0", "--hog-mb", "300"]  # fmt: skip
    res = vm.run(shlex.join(argv) + " 2>&1")
    out = res.stdout
    if cgroup == "rw":
        assert "direct supervisor (cgroup /sys/fs/cgroup/gpulaunch-" in out, out
        assert "killed by the OOM killer at" in out and "(limit 150.0 MiB)" in out, out
        assert res.returncode == 137, out
    else:
        assert "direct supervisor (process groups" in out, out
        assert "not enforced" in out, out  # said at start: the limit does not hold here
        assert res.returncode == 0, out  # the rank used its 300 MiB and ended
        # the container's cgroup is every rank's and the watcher's: not the rank's figures
        assert "peak mem: from wait4's ru_maxrss" in out, out
