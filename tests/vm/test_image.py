"""examples/Containerfile as a user builds and runs it, with podman in the VM lab.

The .deb is built here from this checkout (scripts/build-deb.sh, as tests/integration/
test_deb.py does) and copied in; podman builds the image offline (no registry in the VM)
from `localhost/sdbox-debian:12`, a Debian 12 base that sdbox/vm/configure.sh imported into
podman's store when the VM image was built, without torch (`--build-arg TORCH=`: plain
Python ranks). Then 2-rank jobs run in it as the image means them to: `podman run --rm
IMAGE gpulaunch start ...`, gpulaunch the container's PID 1 under its direct supervisor,
the container's exit status the job's.
"""

from __future__ import annotations

import re
import uuid

import pytest

from sdbox.vm import Machine
from tests.vm.podman import JOB_DIR, deb, image, row, run_job

__all__ = ["deb", "image"]  # the session's image, built once (tests/vm/podman.py)


def test_the_example_image_runs_a_job(vm: Machine, image: str) -> None:
    job = f"img-{uuid.uuid4().hex[:6]}"
    status, out = run_job(vm, image, job)
    assert status == 0, out
    for rank in (0, 1):
        # the package's Python, and gpulaunch the container's PID 1
        said = (
            rf"^\[{rank}\] rank {rank} of 2: /usr/lib/gpulaunch/bin/python\S*; pid 1: .*gpulaunch"
        )
        assert re.search(said, out, re.MULTILINE), out
        assert row(out, rank).startswith("exit 0 exited"), out
    assert f"job {job} succeeded (all 2 ranks exited 0)" in out, out
    # podman's default read-only /sys/fs/cgroup: a process group each, said at start
    assert f"job {job}: direct supervisor (process groups" in out, out
    assert "OMP_NUM_THREADS" not in out, out  # the image's ENV sets it


@pytest.mark.parametrize("cgroup", ["ro", "unmasked"])
def test_a_failing_rank_stops_the_gang_with_its_status(
    vm: Machine, image: str, cgroup: str
) -> None:
    """With podman's default read-only cgroup (process groups), and with it made writable
    as the recipe says (a cgroup per rank, cgroup.kill)."""
    job = f"imgf-{uuid.uuid4().hex[:6]}"
    unmask = ("--security-opt", "unmask=/sys/fs/cgroup") if cgroup == "unmasked" else ()
    status, out = run_job(vm, image, job, "--fail", podman=unmask)
    way = "cgroup /sys/fs/cgroup/gpulaunch-" if unmask else "process groups"
    assert f"job {job}: direct supervisor ({way}" in out, out
    assert status == 3, out  # the container's status is the failing rank's
    assert f"job {job} failed: rank 1 exit 3 (status 3)" in out, out
    assert row(out, 1).startswith("exit 3 cause"), out
    assert row(out, 0).startswith("SIGTERM stopped"), out  # it slept: the gang stopped it


def test_systemd_as_pid_1_runs_the_job_in_scopes(vm: Machine, image: str) -> None:
    """The recipe's other way: `--systemd=always IMAGE /sbin/init`, then `podman exec`."""
    job = f"imgs_{uuid.uuid4().hex[:6]}"  # no dash: unit names would escape it
    name = f"gl-{job}"
    vm.run(
        ["podman", "run", "-d", "--name", name, "--network", "host", "--systemd=always",
         "-v", f"{JOB_DIR}:/srv/job:ro", image, "/sbin/init"],
        check=True,
    )  # fmt: skip
    try:
        booted = vm.run(  # the container's bus comes up a moment after its PID 1
            f"for i in $(seq 300); do state=$(podman exec {name} systemctl is-system-running"
            " --wait 2>/dev/null); case $state in running|degraded) exit 0;; esac; sleep 1;"
            " done; exit 1",
            timeout=400,
        )
        assert booted.returncode == 0, "systemd in the container did not come up"
        res = vm.run(
            f"podman exec -w /srv/job {name} gpulaunch start --job {job} --nproc 2 train.py 2>&1"
        )
        out = res.stdout
        assert res.returncode == 0, out
        assert f"systemd supervisor (gpulaunch-{job}.slice, system manager)" in out, out
        assert "[1] rank 1 of 2: /usr/lib/gpulaunch/bin/python; pid 1: /sbin/init" in out, out
        for rank in (0, 1):
            assert row(out, rank, f"gpulaunch-{job}-rank{rank}.scope").startswith("exit 0"), out
        assert f"job {job} succeeded (all 2 ranks exited 0)" in out, out
    finally:
        vm.run(f"podman rm -f {name}")
