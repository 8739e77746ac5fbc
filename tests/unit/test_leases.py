"""GPU leases (gpulaunch/leases/): flocks on a fake machine's lock files, holders named from
the kernel's /proc/locks, a lease freed by the kernel when its holder is SIGKILLed."""

from __future__ import annotations

import os
import pwd
import signal
import subprocess
import sys
import threading
from dataclasses import replace
from pathlib import Path

import pytest

from gpulaunch.cli import build_parser
from gpulaunch.errors import UnavailableError, UsageError
from gpulaunch.leases.holders import holders, lease_rows, lock_pids, read_note, write_note
from gpulaunch.leases.request import GpusBusyError, take, unleased
from gpulaunch.leases.store import lease_dir, open_store
from gpulaunch.model import Manager
from gpulaunch.options import start_options
from gpulaunch.plan.leaserequest import LeaseRequest, parse_request
from gpulaunch.plan.spec import StartOptions
from tests.fake_machine import FakeGpu, write_fake_machine

UUIDS = ["GPU-0a0a0a0a-1111-2222-3333-444444444444", "GPU-1b1b1b1b-1111-2222-3333-444444444444"]
BUSES = ["0000:1b:00.0", "0000:3d:00.0"]


@pytest.fixture
def machine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    return write_fake_machine(
        tmp_path / "m", [FakeGpu(BUSES[0], 0, UUIDS[0]), FakeGpu(BUSES[1], 1, UUIDS[1])]
    )


def opts(machine: Path, n: int = 1) -> StartOptions:
    return StartOptions(
        script="train.py",
        args=(),
        nproc="gpu",
        job=None,
        master_addr=None,
        master_port=None,
        grace_sec=5.0,
        manager=Manager.SYSTEM,
        machine_root=machine,
        gpu_lease=LeaseRequest(n),
    )


def test_parse_request() -> None:
    assert parse_request("auto:2") == LeaseRequest(2)
    assert parse_request("free:1") == LeaseRequest(1)
    assert parse_request("0,1") is None
    for bad in ("auto:", "auto:0", "auto:x", "auto:-1"):
        with pytest.raises(ValueError, match="needs a number of GPUs"):
            parse_request(bad)


def test_command_line_auto_gpus(machine: Path) -> None:
    args = build_parser().parse_args(["start", "--gpus", "auto:2", "--wait-for-gpus", "t.py"])
    o = start_options(args)
    assert (o.gpu_lease, o.wait_for_gpus, o.resources.gpus, o.nproc) == (
        LeaseRequest(2),
        True,
        None,
        2,
    )


def test_wait_for_gpus_without_a_lease_is_a_usage_error() -> None:
    args = build_parser().parse_args(["start", "--gpus", "0", "--wait-for-gpus", "t.py"])
    with pytest.raises(UsageError, match="--wait-for-gpus waits for a lease: it needs"):
        start_options(args)


def test_two_jobs_get_different_gpus_and_a_third_is_refused_naming_both(machine: Path) -> None:
    first, lease1 = take(opts(machine), LeaseRequest(1))
    second, lease2 = take(opts(machine), LeaseRequest(1))
    assert (first.resources.gpus, second.resources.gpus) == ((0,), (1,))
    assert (first.nproc, second.nproc) == (1, 1)
    assert [g.bus_id for g in lease1.gpus + lease2.gpus] == BUSES
    note = write_note("job-one", machine)
    try:
        with pytest.raises(GpusBusyError) as refused:
            take(opts(machine), LeaseRequest(1))
    finally:
        assert note is not None
        note.unlink()
    line = refused.value.message
    me = f"pid {os.getpid()}"
    for gpu in ("GPU 0 (0000:1b:00.0)", "GPU 1 (0000:3d:00.0)"):
        assert gpu in line
    assert line.count(me) == 2 and "job job-one" in line and "user " in line and "unit " in line
    assert refused.value.exit_code == 69
    lease1.close()  # freed: the next job gets GPU 0 at once
    third, lease3 = take(opts(machine), LeaseRequest(1))
    assert third.resources.gpus == (0,)
    lease2.close()
    lease3.close()


def test_too_many_gpus_asked_for(machine: Path) -> None:
    with pytest.raises(Exception, match="this machine has 2 GPU"):
        take(opts(machine, 3), LeaseRequest(3))


def test_auto_gpus_on_a_machine_without_gpus_is_unavailable_69(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """issue 35: `--gpus auto:1` without GPUs exited 2 where the README says 69."""
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    empty = write_fake_machine(tmp_path / "none", [])
    for plan in (unleased, take):
        with pytest.raises(UnavailableError, match="this machine has 0 GPU") as raised:
            plan(opts(empty), LeaseRequest(1))
        assert raised.value.exit_code == 69
    with pytest.raises(UnavailableError, match="this machine has 2 GPU"):
        take(opts(machine_of(tmp_path), 3), LeaseRequest(3))


def machine_of(tmp_path: Path) -> Path:
    return write_fake_machine(
        tmp_path / "two", [FakeGpu(BUSES[0], 0, UUIDS[0]), FakeGpu(BUSES[1], 1, UUIDS[1])]
    )


HOLDER = """
import sys
from pathlib import Path
from gpulaunch.plan.leaserequest import LeaseRequest
from gpulaunch.leases.request import take
from gpulaunch.model import Manager
from gpulaunch.plan.spec import StartOptions
o = StartOptions(script="t.py", args=(), nproc="gpu", job=None, master_addr=None,
                 master_port=None, grace_sec=5.0, manager=Manager.SYSTEM,
                 machine_root=Path(sys.argv[1]))
o, lease = take(o, LeaseRequest(int(sys.argv[2])))
print(o.resources.gpus, flush=True)
sys.stdin.read()
"""


def hold(machine: Path, n: int) -> subprocess.Popen[str]:
    """Another process holding the first n GPUs until it ends."""
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(machine), str(n)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == str(tuple(range(n)))
    return proc


def test_a_sigkilled_holder_frees_its_gpus_at_once(machine: Path) -> None:
    holder = hold(machine, 2)
    try:
        with pytest.raises(GpusBusyError, match=f"pid {holder.pid}"):
            take(opts(machine), LeaseRequest(1))
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    o, lease = take(opts(machine), LeaseRequest(2))  # no retry, no wait: the kernel freed it
    assert o.resources.gpus == (0, 1)
    lease.close()


def test_wait_for_gpus_waits_until_the_holder_is_gone(
    machine: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    holder = hold(machine, 2)
    got: list[tuple[int, ...] | None] = []

    def waiter() -> None:
        o, lease = take(opts(machine), LeaseRequest(1), wait=True)
        got.append(o.resources.gpus)
        lease.close()

    thread = threading.Thread(target=waiter)
    thread.start()
    thread.join(1.0)
    assert thread.is_alive() and not got  # still waiting: GPUs held
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    thread.join(60)
    assert got == [(0,)]
    assert "waiting for 1 free GPU(s) (--wait-for-gpus)" in capsys.readouterr().err


def test_wait_for_gpus_wakes_for_whichever_gpu_is_freed_first(machine: Path) -> None:
    first = hold(machine, 1)  # GPU 0
    second = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(machine), "1"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert second.stdout is not None and second.stdout.readline().strip() == "(1,)"
    got: list[tuple[int, ...] | None] = []

    def waiter() -> None:
        o, lease = take(opts(machine), LeaseRequest(1), wait=True)
        got.append(o.resources.gpus)
        lease.close()

    thread = threading.Thread(target=waiter)
    thread.start()
    try:
        thread.join(1.0)
        assert thread.is_alive() and not got
        second.send_signal(signal.SIGKILL)  # GPU 1, the last in order, is freed first
        second.wait()
        thread.join(60)
        assert got == [(1,)]
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
        thread.join(60)


def test_a_link_in_the_store_is_not_followed(machine: Path, tmp_path: Path) -> None:
    store = lease_dir(machine)
    store.mkdir(parents=True)
    (tmp_path / "elsewhere").write_text("")
    (store / "nvidia0").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(GpusBusyError, match="has no lock file of root's"):
        take(opts(machine), LeaseRequest(1))


def test_a_store_others_may_write_is_refused(machine: Path) -> None:
    store = lease_dir(machine)
    store.mkdir(parents=True)
    store.chmod(0o777)
    with pytest.raises(UnavailableError, match="a directory of root's"):
        open_store(machine)


def test_render_shows_the_first_gpus_without_a_lease(machine: Path) -> None:
    first, lease = take(opts(machine), LeaseRequest(1))
    try:
        assert unleased(opts(machine), LeaseRequest(1)).resources.gpus == (0,)
    finally:
        lease.close()


def test_list_shows_who_holds_which_gpu(machine: Path) -> None:
    holder = hold(machine, 1)
    try:
        rows = lease_rows(machine)
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert len(rows) == 1
    device, job, user, unit, pid = rows[0]
    assert (device, pid) == ("/dev/nvidia0", str(holder.pid))
    assert user == pwd.getpwuid(os.geteuid()).pw_name and unit and job == "?"  # no note
    assert lease_rows(machine) == []


def test_a_job_naming_leased_gpus_is_warned_of_their_holders(machine: Path, tmp_path: Path) -> None:
    holder = hold(machine, 1)
    script = tmp_path / "train.py"
    script.write_text("pass\n")
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    try:
        res = subprocess.run(
            [sys.executable, "-m", "gpulaunch", "start", "--supervisor", "direct"]
            + ["--machine-root", str(machine), "--gpus", "0,1", str(script)],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert res.returncode == 0, res.stderr
    warning = (
        "gpulaunch: warning: other jobs lease GPUs this job uses: GPU 0 (0000:1b:00.0): job ?, "
        f"user {pwd.getpwuid(os.geteuid()).pw_name}, unit "
    )
    assert (
        warning in res.stderr and f"pid {holder.pid} (--gpus auto:N takes free ones)" in res.stderr
    )


def test_proc_locks_parsing(tmp_path: Path) -> None:
    (tmp_path / "locks").write_text(
        "1: POSIX  ADVISORY  WRITE 20750 00:4d:105 0 EOF\n"
        "2: FLOCK  ADVISORY  WRITE 4242 fe:00:2245256 0 EOF\n"
        "2: -> FLOCK  ADVISORY  WRITE 4243 fe:00:2245256 0 EOF\n"
    )
    assert lock_pids(tmp_path) == {(0xFE, 0, 2245256): 4242}


def test_a_note_of_an_earlier_process_is_not_believed(machine: Path) -> None:
    note = write_note("mine", machine)
    assert note is not None
    assert read_note(os.getpid(), os.geteuid(), machine) == "mine"
    assert read_note(os.getpid(), os.geteuid() + 1, machine) is None  # not the holder's user
    note.write_text("1 someone-else")  # another start time: the pid was reused
    assert read_note(os.getpid(), os.geteuid(), machine) is None
    note.unlink()


def test_nobody_holds_a_free_gpu(machine: Path) -> None:
    first, lease = take(opts(machine), LeaseRequest(1))
    gpus = lease.gpus
    lease.close()
    assert holders(gpus, machine) == []
    assert replace(first, gpu_lease=None).resources.gpus == (0,)
