"""The direct supervisor's cgroup way, in a `Delegate=yes` service (systemd-run): a
rank's memory limit enforced and the OOM kill named; a setsid'd daemon stopped with
cgroup.kill when the job ends, while the service lives on; a SIGKILLed watcher leaves
no process and no cgroup behind (the service's stop, systemd's doing)."""

from __future__ import annotations

import json
import shlex

from sdbox.vm import Machine
from tests.vm.vmjobs import RANK, new_job, wait_for

KILLED = "killed by the OOM killer at"


def test_direct_supervisor_in_a_delegated_service(vm: Machine) -> None:
    job = new_job(vm, "root", "direct")
    res = vm.run(
        ["systemd-run", "--quiet", "--wait", "--pipe", "--collect", "-p", "Delegate=yes",
         "-p", "WorkingDirectory=/var/tmp", "gpulaunch", "start", "--job", job.id,
         "--supervisor", "direct", "--nproc", "2", "--memory-max", "150M", RANK,
         "--dir", job.dir, "--hog-rank", "1", "--hog-mb", "400"],
    )  # fmt: skip
    out = res.stdout + res.stderr
    assert "direct supervisor (cgroup /sys/fs/cgroup/system.slice/" in out, out
    assert f"rank 1 {KILLED}" in out and "(limit 150.0 MiB)" in out, out
    assert res.returncode == 137, out


def test_direct_supervisor_stops_daemons_and_leaves_nothing(vm: Machine) -> None:
    job = new_job(vm, "root", "directd")
    unit = f"vmt-{job.id}.service"
    start = shlex.join(
        ["gpulaunch", "start", "--job", job.id, "--supervisor", "direct", "--nproc", "1",
         RANK, "--dir", job.dir, "--spawn"]
    )  # fmt: skip
    script = f"{start} > {job.dir}/out 2>&1; echo $? > {job.dir}/status; sleep 600"
    vm.run(
        ["systemd-run", "--quiet", "--collect", "-u", unit, "-p", "Delegate=yes",
         "-p", "WorkingDirectory=/var/tmp", "sh", "-c", script],
        check=True,
    )  # fmt: skip
    try:
        wait_for(vm, f"test -e {job.dir}/status", "the job's end")
        daemon = json.loads(vm.run(f"cat {job.dir}/rank0.daemon.json", check=True).stdout)
        out = vm.run(f"cat {job.dir}/out {job.dir}/status").stdout
        assert out.split()[-1] == "0", out
        # The job ended with its rank; the daemon went with it (cgroup.kill) while the
        # service, and so its cgroup, still lives: gpulaunch's doing, not systemd's.
        assert vm.run(f"systemctl is-active {unit}").stdout.strip() == "active"
        assert vm.run(f"kill -0 {daemon['pid']}").returncode != 0, "the daemon outlived the job"
        cgroup = vm.run(f"systemctl show -P ControlGroup {unit}", check=True).stdout.strip()
        left = vm.run(f"ls /sys/fs/cgroup{cgroup}").stdout.split()
        assert f"gpulaunch-{job.id}" not in left, left  # removed at the job's end
    finally:
        vm.run(f"systemctl stop {unit}")

    # A SIGKILLed watcher: the service ends, systemd stops what is left in its cgroup.
    job = new_job(vm, "root", "directk")
    unit = f"vmt-{job.id}.service"
    vm.run(
        ["systemd-run", "--quiet", "--collect", "-u", unit, "-p", "Delegate=yes",
         "-p", "WorkingDirectory=/var/tmp", "gpulaunch", "start", "--job", job.id,
         "--supervisor", "direct", "--nproc", "1", RANK, "--dir", job.dir, "--spawn",
         "--sleep", "600"],
        check=True,
    )  # fmt: skip
    wait_for(vm, f"test -e {job.dir}/rank0.daemon.json", "the rank's daemon")
    daemon = json.loads(vm.run(f"cat {job.dir}/rank0.daemon.json", check=True).stdout)
    cgroup = vm.run(f"systemctl show -P ControlGroup {unit}", check=True).stdout.strip()
    rank = job.rank(0)
    vm.run(f"systemctl kill -s KILL --kill-who=main {unit}", check=True)
    # Its end, not its stop under way: is-active says no while it is still deactivating,
    # and the cgroup goes when systemd has killed what was left in it (a load-dependent
    # race: CI saw the cgroup still there).
    ended = (
        f'case "$(systemctl show -P ActiveState {unit})" in inactive|failed) true;; *) false;; esac'
    )
    wait_for(vm, ended, "the service's end")
    for pid in (rank["pid"], daemon["pid"]):
        assert vm.run(f"kill -0 {pid}").returncode != 0, f"{pid} outlived the watcher"
    assert vm.run(f"test -e /sys/fs/cgroup{cgroup}").returncode != 0, "its cgroup is left"
