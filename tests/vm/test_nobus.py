"""An SSH user's `--memory-max` job with and without a user bus, in a real Debian 12 (issue 29).

A minimal server has no `dbus-user-session`: `user@UID.service` runs for an SSH
login, but there is no user bus. Here bob's `dbus.socket` is masked and stopped
for this module (its socket file stays behind, refusing connections: the harder
case); alice keeps hers. Both start, from their SSH login's session scope, a job
whose rank 1 touches 400 MiB under `--memory-max 150M`: the user manager's
limit must end it (systemd's supervision through the front end, on the bus or
on the manager's private socket), never a fallback that enforces nothing.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from sdbox.vm import Machine
from tests.vm.vmjobs import new_job

HOG = ("--hog-rank", "1", "--hog-mb", "400")


@pytest.fixture(scope="module")
def nobus(vm: Machine) -> Iterator[str]:
    user = "bob"
    vm.run("systemctl --user mask --now dbus.socket dbus.service", user=user, check=True)
    try:
        yield user
    finally:
        vm.run(
            "systemctl --user unmask dbus.socket dbus.service; systemctl --user start dbus.socket",
            user=user,
        )


def _oom_named(out: str) -> None:
    """Rank 1 was ended by the limit, and the report says the OOM killer did it."""
    assert "failed: rank 1 killed by the OOM killer at" in out, out
    assert "(limit 150.0 MiB)" in out, out


def _only_own_figures(out: str) -> None:
    """Real units; each rank's figures from its own scope's cgroup."""
    assert "cpu: from the unit's cgroup (cpu.stat); peak mem: from the unit's cgroup" in out, out
    rows = [line.split() for line in out.splitlines() if line.split()[:1] in (["0"], ["1"])]
    for row in rows:
        assert row[1].startswith("gpulaunch-") and row[1].endswith(".scope"), out  # real units
    # rank 0 waited: its peak is its own, never rank 1's nor the session's
    rank0 = next(r for r in rows if r[0] == "0")
    if rank0[-1] == "MiB":
        assert float(rank0[-2]) < 100, out


def test_ssh_user_without_a_user_bus(vm: Machine, nobus: str) -> None:
    job = new_job(vm, nobus, "nobus")
    res = job.start("--nproc", "2", "--memory-max", "150M", script_args=HOG)
    out = res.stdout
    print(out)
    assert res.returncode == 137, out
    assert "no user bus" in out and "dbus-user-session" in out, out
    assert "systemd supervisor" in out and "direct supervisor" not in out, out
    assert "not enforced" not in out, out
    _oom_named(out)
    _only_own_figures(out)
    status = job.run(f"gpulaunch status {job.id}")  # from the record file: no bus
    assert "killed by the OOM killer at" in status.stdout + status.stderr, status


def test_ssh_user_with_a_user_bus(vm: Machine) -> None:
    job = new_job(vm, "alice", "withbus")
    res = job.start("--nproc", "2", "--memory-max", "150M", script_args=HOG)
    out = res.stdout
    print(out)
    assert res.returncode == 137, out
    assert "no user bus" not in out and "systemd supervisor" in out, out
    _oom_named(out)
    _only_own_figures(out)
