"""GPU leases (gpulaunch/leases/): flocks on a fake machine's lock files, holders named from
the kernel's /proc/locks, a lease freed by the kernel when its holder is SIGKILLed."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from gpulaunch.cli import build_parser
from gpulaunch.errors import UnavailableError, UsageError
from gpulaunch.leases.holders import holders, lease_rows, lock_pids
from gpulaunch.leases.notes import notes_dir, read_note, write_note
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


def test_root_notes_go_where_only_root_writes(machine: Path) -> None:
    """Issue 35: the notes' directory was a sticky 1777 one on /run, where any user could
    make files until /run had no inode left. Root's is 0755 now, and one an older version
    left 1777 is closed again by root's next note."""
    note = write_note("mine", machine)
    assert note is not None and note.parent == machine / "run/gpulaunch/holders"
    assert stat.S_IMODE(note.parent.stat().st_mode) == 0o755
    note.unlink()
    stale = note.parent / "999999999"  # a SIGKILLed holder's: removed by the next note
    stale.write_text("1 gone")
    note.parent.chmod(0o1777)
    assert read_note(os.getpid(), 0, machine) is None  # a directory others write: not believed
    note = write_note("mine", machine)
    assert note is not None and stat.S_IMODE(note.parent.stat().st_mode) == 0o755
    assert read_note(os.getpid(), 0, machine) == "mine"
    assert os.listdir(note.parent) == [note.name]
    note.unlink()
    for d in (machine / "run/gpulaunch", *(machine / "run/gpulaunch").rglob("*")):
        assert not (d.is_dir() and d.stat().st_mode & 0o002), d


USER = 54321  # an ordinary user (no passwd entry needed)


def as_user_writing_a_note(machine: Path, job: str) -> tuple[int, int]:
    """A child that becomes USER, writes its note and stays until its pipe closes: (pid, fd)."""
    r, w = os.pipe()
    r2, w2 = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - in the child
        code = 1
        try:
            os.close(r)
            os.close(w2)
            os.setgroups([])
            os.setgid(USER)
            os.setuid(USER)
            made = write_note(job, machine)
            os.write(w, str(made).encode())
            os.close(w)
            os.read(r2, 1)
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    os.close(r2)
    with os.fdopen(r) as f:
        written = f.read()
    assert written == str(notes_dir(USER, machine) / str(pid)), written
    return pid, w2


@pytest.fixture
def reachable(tmp_path: Path) -> Iterator[Path]:
    """A fake machine's root an ordinary user can reach (pytest's tmp_path is root's 0700)."""
    top = Path(tempfile.mkdtemp(prefix="gl-leases-", dir="/tmp"))
    top.chmod(0o711)
    try:
        yield write_fake_machine(top / "m", [FakeGpu(BUSES[0], 0, UUIDS[0])])
    finally:
        shutil.rmtree(top)


def test_a_users_note_is_in_their_own_runtime_directory(reachable: Path) -> None:
    """An ordinary user's note goes into /run/user/<uid> (their own tmpfs, as logind makes
    it), never into a directory of /run others share; root reads it there, trusting no
    link and nothing that is not the user's."""
    machine = reachable
    runtime = machine / "run/user" / str(USER)
    runtime.mkdir(parents=True)
    os.chown(runtime, USER, USER)
    runtime.chmod(0o700)
    pid, keep = as_user_writing_a_note(machine, "alices-job")
    try:
        assert read_note(pid, USER, machine) == "alices-job"
        assert read_note(pid, USER + 1, machine) is None  # not that user's
        assert not (machine / "run/gpulaunch").exists()  # nothing made on /run for a user
        gl = runtime / "gpulaunch"
        assert gl.stat().st_uid == USER and stat.S_IMODE((gl / "holders").stat().st_mode) == 0o700
        # a link the user planted is not followed by root, nor a note that is not theirs
        (runtime / "elsewhere").mkdir()
        gl.rename(runtime / "elsewhere/gpulaunch")
        gl.symlink_to(runtime / "elsewhere/gpulaunch")
        assert read_note(pid, USER, machine) is None
        gl.unlink()
        (runtime / "elsewhere/gpulaunch").rename(gl)
        assert read_note(pid, USER, machine) == "alices-job"
        os.chown(gl / "holders" / str(pid), 0, 0)
        assert read_note(pid, USER, machine) is None
    finally:
        os.close(keep)
        os.waitpid(pid, 0)


def test_a_user_without_a_runtime_directory_writes_no_note(reachable: Path) -> None:
    machine = reachable
    (machine / "run/user").mkdir(parents=True)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - in the child
        try:
            os.setgroups([])
            os.setgid(USER)
            os.setuid(USER)
            os.write(w, str(write_note("x", machine)).encode())
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r) as f:
        assert f.read() == "None"
    os.waitpid(pid, 0)
    assert os.listdir(machine / "run/user") == []


HIDER = """
import fcntl, json, os, signal, sys
from pathlib import Path
from gpulaunch.leases.holders import lease_rows
from gpulaunch.leases.request import GpusBusyError, take
from gpulaunch.model import Manager
from gpulaunch.plan.leaserequest import LeaseRequest
from gpulaunch.plan.spec import StartOptions
machine = Path(sys.argv[1])
o = StartOptions(script="t.py", args=(), nproc="gpu", job=None, master_addr=None,
                 master_port=None, grace_sec=5.0, manager=Manager.SYSTEM, machine_root=machine)
_, lease = take(o, LeaseRequest(2))  # the store and its lock files
lease.close()
r, w = os.pipe()
taker = os.fork()
if taker == 0:  # flocks GPU 0, leaves it to a setsid child, exits
    fd = os.open(machine / "run/gpulaunch/gpus/nvidia0", os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)
    if os.fork() == 0:
        os.setsid()
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 1)
        os.dup2(null, 2)
        os.write(w, str(os.getpid()).encode())
        os.close(w)
        os.close(r)
        signal.pause()
    os._exit(0)
os.close(w)
os.waitpid(taker, 0)
keeper = int(os.read(r, 64))
o1 = StartOptions(script="t.py", args=(), nproc="gpu", job=None, master_addr=None,
                  master_port=None, grace_sec=5.0, manager=Manager.SYSTEM, machine_root=machine)
try:
    _, lease = take(o1, LeaseRequest(2))
    refusal = None
except GpusBusyError as exc:
    refusal = str(exc)
print(json.dumps({"keeper": keeper, "taker": taker, "refusal": refusal,
                  "rows": lease_rows(machine)}), flush=True)
os.kill(keeper, signal.SIGKILL)
"""


@pytest.mark.parametrize("pid_namespace", [False, True])
def test_a_holder_that_hides_behind_a_setsid_child_is_named(
    machine: Path, pid_namespace: bool
) -> None:
    """Issue 35: a process flocks a GPU's lock file, leaves it to a setsid child and exits.
    /proc/locks then names a dead pid (or, in a pid namespace such as a container's,
    nothing at all: the refusal said `held by ;` and `list` left the GPU out). The
    process that keeps it is named from its open file's fdinfo."""
    argv = [sys.executable, "-c", HIDER, str(machine)]
    if pid_namespace:  # the hider and the one asking in a pid namespace of their own
        argv = ["unshare", "--pid", "--fork", "--mount-proc", *argv]
    res = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=True)
    seen = json.loads(res.stdout)
    me = pwd.getpwuid(os.geteuid()).pw_name
    keeper = f"GPU 0 ({BUSES[0]}): job ?, user {me}, unit "
    assert keeper in seen["refusal"] and f"pid {seen['keeper']}" in seen["refusal"], seen
    assert "held by ;" not in seen["refusal"]
    assert [row[0] for row in seen["rows"]] == ["/dev/nvidia0"], seen
    assert seen["rows"][0][2] == me and seen["rows"][0][4] == str(seen["keeper"]), seen


def test_the_shipped_tmpfiles_entry_makes_nothing_others_may_write() -> None:
    """Issue 35: packaging/tmpfiles.d made /run/gpulaunch/holders 1777 at every boot (and
    `gpulaunch setup` / the .deb install ran it). Every path it makes is root's and closed
    to others; `d` also closes the one an older version made."""
    conf = Path(__file__).resolve().parents[2] / "packaging/tmpfiles.d/gpulaunch.conf"
    entries = [line.split() for line in conf.read_text().splitlines() if line[:1].isalpha()]
    assert entries and all(e[1].startswith("/run/gpulaunch") for e in entries)
    for kind, path, mode, user, group, *_ in entries:
        assert (user, group) == ("root", "root") and not int(mode, 8) & 0o022, (kind, path, mode)
    assert ["d", "/run/gpulaunch/holders", "0755"] in [e[:3] for e in entries]
