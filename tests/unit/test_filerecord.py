"""The record file against what someone else planted (issue 22 items 4, 5): no link
followed, nothing believed or signalled on the file's word alone, one file per node."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from gpulaunch.jobapi import filerecord, procid
from gpulaunch.jobapi.view import JobState
from gpulaunch.watcher import errorfile
from tests.unit.fakes import record_view as _view


@pytest.fixture
def base(tmp_path: Path) -> Path:
    return tmp_path / "state" / "gpulaunch" / "jobs"


def test_a_planted_jobs_link_is_not_followed(base: Path, tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.mkdir()
    for i in range(3):
        (victim / f"{i}.json").write_text("{}")
    base.parent.mkdir(parents=True)
    base.symlink_to(victim)
    with pytest.raises(OSError):
        filerecord.write(_view(JobState.RUNNING), "started", base)
    assert sorted(p.name for p in victim.iterdir()) == ["0.json", "1.json", "2.json"]
    assert filerecord.find("j", base) is None and filerecord.recent(base) == []


def test_a_planted_tmp_link_is_not_written_through(base: Path, tmp_path: Path) -> None:
    filerecord.write(_view(JobState.RUNNING), "started", base)
    target = tmp_path / "precious"
    target.write_text("keep")
    target.chmod(0o600)
    name = filerecord.file_name("j")
    (base / f".{name}.{os.getpid()}.tmp").symlink_to(target)
    filerecord.write(_view(JobState.SUCCEEDED), "ended", base)
    assert target.read_text() == "keep"
    found = filerecord.find("j", base)
    assert found is not None and found.state is JobState.SUCCEEDED


def test_a_record_that_is_a_link_is_not_read_nor_pruned_through(base: Path, tmp_path: Path) -> None:
    filerecord.write(_view(JobState.SUCCEEDED), "ended", base)
    real = base / filerecord.file_name("j")
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text(real.read_text())
    real.unlink()
    real.symlink_to(elsewhere)
    assert filerecord.find("j", base) is None
    for i in range(filerecord.KEEP + 5):
        filerecord.write(_view(JobState.SUCCEEDED, job=f"n{i}"), "ended", base)
    assert elsewhere.exists()  # never pruned through the link


def test_a_group_writable_jobs_dir_is_refused(base: Path) -> None:
    base.mkdir(parents=True, mode=0o700)
    base.chmod(0o777)
    with pytest.raises(PermissionError):
        filerecord.write(_view(JobState.RUNNING), "started", base)


def test_root_keeps_its_records_under_run_whatever_home_says(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    env = {"HOME": "/home/mallory", "XDG_STATE_HOME": "/home/mallory/.local/state"}
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    assert filerecord.jobs_dir(env) == Path("/run/gpulaunch/jobs")
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert filerecord.jobs_dir(env) == Path("/home/mallory/.local/state/gpulaunch/jobs")


def test_running_is_believed_only_while_that_very_watcher_runs(base: Path) -> None:
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        filerecord.write(_view(JobState.RUNNING, sleeper.pid), "started", base)
        found = filerecord.find_record("j", base)
        assert found is not None and found.watcher_alive()
        assert filerecord.find("j", base).state is JobState.RUNNING  # type: ignore[union-attr]
    finally:
        sleeper.kill()
        sleeper.wait()
    found = filerecord.find_record("j", base)
    assert found is not None and not found.watcher_alive()
    believed = found.believed()
    assert believed.state is JobState.FAILED and "went away" in believed.cause
    assert not filerecord.send_signal(found, signal.SIGUSR1)
    assert filerecord.wait("j", base) is not None  # returns at once: nothing to wait for


def test_a_forged_pid_is_not_signalled(base: Path) -> None:
    """A record naming a live process whose start time differs (reused pid, or forged)."""
    victim = subprocess.Popen(["sleep", "60"])
    try:
        filerecord.write(_view(JobState.RUNNING, victim.pid), "started", base)
        path = base / filerecord.file_name("j")
        entry = json.loads(path.read_text())
        ident = json.loads(entry[filerecord.WATCHER_KEY])
        ident["start"] -= 1
        entry[filerecord.WATCHER_KEY] = json.dumps(ident)
        path.write_text(json.dumps(entry))
        found = filerecord.find_record("j", base)
        assert found is not None
        assert not filerecord.send_signal(found, signal.SIGTERM)
        assert victim.poll() is None  # still running
        entry.pop(filerecord.WATCHER_KEY)  # no identity at all: not believed either
        path.write_text(json.dumps(entry))
        found = filerecord.find_record("j", base)
        assert found is not None and not filerecord.send_signal(found, signal.SIGTERM)
        assert victim.poll() is None
    finally:
        victim.kill()
        victim.wait()


def test_one_file_per_node(base: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for node in ("n1", "n2"):
        monkeypatch.setattr(filerecord, "node_name", lambda node=node: node)
        filerecord.write(_view(JobState.SUCCEEDED), "ended", base)
    assert sorted(p.name for p in base.iterdir()) == ["j@n1.json", "j@n2.json"]
    assert sorted(r.node for r in filerecord.recent_records(base)) == ["n1", "n2"]


def test_another_boot_is_not_here() -> None:
    me = procid.Identity.of(os.getpid())
    assert me is not None and me.alive()
    assert not procid.Identity(me.pid, me.start, "another-boot", me.pidns).alive()
    assert not procid.Identity(me.pid, me.start, me.boot, me.pidns + 1).alive()


def _job_dir(parent: Path, name: str, pid: int) -> Path:
    d = parent / name
    d.mkdir()
    me = procid.Identity.of(os.getpid())
    assert me is not None
    start = me.start if pid == os.getpid() else (procid.start_time(pid) or 1)
    ident = procid.Identity(pid, start, me.boot, me.pidns)
    (d / errorfile.MARKER).write_text(json.dumps(ident.to_json()))
    (d / "attempt_0" / "0").mkdir(parents=True)
    return d


def test_error_dirs_of_dead_watchers_are_pruned_and_nothing_else(tmp_path: Path) -> None:
    """Issue 22 item 13: a later start removes what a SIGKILLed watcher left; a live
    watcher's directory, one without a marker, and a link are left alone."""
    parent = tmp_path / "gpulaunch"
    parent.mkdir()
    dead = subprocess.Popen(["true"])
    dead.wait()
    gone = _job_dir(parent, "gone.abc", dead.pid)
    mine = _job_dir(parent, "live.def", os.getpid())
    unmarked = parent / "unmarked.ghi"
    unmarked.mkdir()
    target = tmp_path / "target"
    target.mkdir()
    (target / errorfile.MARKER).write_text((gone / errorfile.MARKER).read_text())
    (parent / "link.jkl").symlink_to(target)
    assert errorfile.prune_dead(parent) == 1
    assert not gone.exists() and mine.exists() and unmarked.exists() and target.exists()
    _job_dir(parent, "gone2.abc", dead.pid)
    files = errorfile.ErrorFiles(tmp_path, "next")  # a later start prunes first
    assert (files.root / errorfile.MARKER).exists()
    files.__exit__(None, None, None)
    assert sorted(p.name for p in parent.iterdir()) == ["link.jkl", "live.def", "unmarked.ghi"]


def test_another_nodes_running_record_is_its_word(
    base: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A shared $HOME: node n2's running job is not called lost on n1 (nothing there can
    check it), and `find` on n1 does not read it."""
    monkeypatch.setattr(filerecord, "node_name", lambda: "n2")
    filerecord.write(_view(JobState.RUNNING, pid=999999999), "started", base)
    monkeypatch.setattr(filerecord, "node_name", lambda: "n1")
    assert filerecord.find("j", base) is None
    assert [v.state for v in filerecord.recent(base)] == [JobState.RUNNING]
    assert filerecord.recent(base, this_node=True) == []


def test_wait_returns_once_the_watcher_and_then_its_keeper_are_gone(base: Path) -> None:
    """Issue 35 item 5: `stop`/`wait` without a bus return once nothing of the job is left:
    the record names the watcher's keeper (what ends the ranks' leftovers) and waits for it."""
    import threading

    watcher = subprocess.Popen(["sleep", "60"])
    keeper = subprocess.Popen(["sh", "-c", "read x"], stdin=subprocess.PIPE)
    assert keeper.stdin is not None
    waited: list[object] = []
    try:
        filerecord.write(_view(JobState.RUNNING, watcher.pid), "started", base, keeper=keeper.pid)
        found = filerecord.find_record("j", base)
        assert found is not None and found.keeper == procid.Identity.of(keeper.pid)
        thread = threading.Thread(target=lambda: waited.append(filerecord.wait("j", base)))
        thread.start()
        watcher.kill()
        watcher.wait()
        thread.join(0.5)
        assert thread.is_alive() and not waited  # the keeper still runs: not yet
        keeper.stdin.close()
        keeper.wait()
        thread.join(30)
        assert not thread.is_alive() and len(waited) == 1
    finally:
        for p in (watcher, keeper):
            p.kill()
            p.wait()


def test_wait_does_not_wait_for_a_keeper_that_is_pid_1(base: Path) -> None:
    """`exec gpulaunch start` as a container's PID 1: its keeper's end is the container's, and
    `stop`'s, so `wait` returns with the watcher's end (here, PID 1 is this machine's init)."""
    import threading

    watcher = subprocess.Popen(["sleep", "60"])
    waited: list[object] = []
    try:
        filerecord.write(_view(JobState.RUNNING, watcher.pid), "started", base, keeper=1)
        found = filerecord.find_record("j", base)
        assert found is not None and found.keeper is not None and found.keeper.pid == 1
        thread = threading.Thread(target=lambda: waited.append(filerecord.wait("j", base)))
        thread.daemon = True  # (without the rule it would wait for init)
        thread.start()
        watcher.kill()
        watcher.wait()
        thread.join(30)
        assert not thread.is_alive() and len(waited) == 1
    finally:
        watcher.kill()
        watcher.wait()
