"""gpulaunch in a real container (podman, root, no registry: `--rootfs` of a copy of the
VM's system), the direct supervisor chosen by itself (no systemd inside):

- with its own cgroup namespace and a writable cgroup2: the cgroup way, `--memory-max`
  enforced and the OOM kill named;
- with podman's default read-only cgroup: the process-group way, the limit not
  enforced and the start says so (docs/environments.md), the rank runs to its end.
"""

from __future__ import annotations

import json
import shlex

import pytest

from sdbox.vm import Machine
from tests.vm.vmjobs import RANK, new_job, wait_for

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


@pytest.mark.parametrize("cgroup", ["rw", "ro"])
def test_doctor_in_a_container_says_what_the_direct_supervisor_enforces(
    vm: Machine, cgroup: str
) -> None:
    """Its cgroups rows follow the supervisor a job gets there: with a read-only cgroup
    they said "enforced" (the controllers exist) while the supervisor row said "no limits"."""
    argv = [*PODMAN, *(RW_CGROUP if cgroup == "rw" else []), *ROOTFS,
            "gpulaunch", "doctor", "--json"]  # fmt: skip
    res = vm.run("mkdir -p /var/tmp/vmt && " + shlex.join(argv))
    assert res.stdout.startswith("{"), (res.returncode, res.stdout, res.stderr)
    report = json.loads(res.stdout)
    assert report["supervisor"] == "direct", res.stdout
    rows = {c["item"]: c for c in report["checks"] if c["area"] == "cgroups"}
    memory = rows["--memory-max"]
    if cgroup == "rw":
        assert memory["status"] == "ok" and "direct supervisor" in memory["detail"], memory
    else:
        assert memory["status"] == "warn" and "process groups" in memory["detail"], memory
    assert rows["--gpu-isolation"]["status"] == "warn", rows


def test_podman_stop_stops_the_gang_gracefully(vm: Machine) -> None:
    """gpulaunch as the container's PID 1: `podman stop` (SIGTERM) stops every rank and
    their daemons within the grace, and the report says so."""
    job = new_job(vm, "root", "ctstop")
    name = f"gl-{job.id}"
    argv = ["podman", "run", "-d", "--name", name, *PODMAN[3:], *ROOTFS,
            "gpulaunch", "start", "--job", job.id, "--nproc", "2", RANK, "--dir", job.dir,
            "--spawn", "--sleep", "600"]  # fmt: skip
    vm.run(shlex.join(argv), check=True)
    try:
        wait_for(
            vm, f"test -e {job.dir}/rank0.daemon.json -a -e {job.dir}/rank1.daemon.json", "ranks"
        )
        vm.run(f"podman stop -t 60 {name}", check=True, timeout=200)
        status = vm.run(f"podman inspect -f '{{{{.State.ExitCode}}}}' {name}", check=True)
        assert status.stdout.strip() == "143", status
        logs = vm.run(f"podman logs {name} 2>&1").stdout
        assert f"job {job.id} stopped by SIGTERM (status 143)" in logs, logs
        left = vm.run(f"pgrep -f {shlex.quote(f'vmrank[.]py --dir {job.dir}')}")
        assert left.returncode != 0, left.stdout  # nothing of the job outlives it
    finally:
        vm.run(f"podman rm -f {name}")
