"""The test harness itself: a real systemd, a box that boots, isolates and goes away."""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sdbox import Box, BoxError, HostSystemd, host_systemd_running
from sdbox.box import PREFIX, _state_dir, cgroup2_root, clean_stale_boxes

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.integration
box_only = pytest.mark.skipif(
    host_systemd_running(), reason="the host runs systemd, so no box is booted here"
)


def token() -> str:
    return secrets.token_hex(3)


def lines(box: Box | HostSystemd, argv: list[str]) -> list[str]:
    result = box.run(argv, capture_output=True, check=True)
    return result.stdout.splitlines()


def cgroup_line(text: list[str]) -> str:
    return next(line for line in text if line.startswith("0::"))


def wait_for(condition: object, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if callable(condition) and condition():
            return True
        time.sleep(0.01)
    return False


@pytest.fixture
def scratch_dir() -> Iterator[Path]:
    """A host directory the box may bind (not under /tmp, which the box mounts afresh)."""
    path = Path(tempfile.mkdtemp(prefix="sdbox-test-", dir="/var/tmp"))
    yield path
    shutil.rmtree(path)


# -- any real systemd (the session's box, or the host's)


def test_systemd_is_running_with_no_failed_units(box: Box | HostSystemd) -> None:
    state = box.run(["systemctl", "is-system-running"], capture_output=True).stdout.strip()
    assert state == "running"
    assert lines(box, ["systemctl", "--failed", "--no-legend", "--plain"]) == []


def test_the_boxs_hostname_resolves(box: Box | HostSystemd) -> None:
    """As on every real host: torch gives a node's FQDN to its ranks, Gloo resolves it."""
    name = box.run(["hostname"], capture_output=True).stdout.strip()
    res = box.run(["getent", "hosts", name], capture_output=True)
    assert res.returncode == 0 and name in res.stdout, res
    assert box.run(["getent", "hosts", "localhost"], capture_output=True).returncode == 0


def test_systemd_run_runs_a_command_as_a_unit(box: Box | HostSystemd) -> None:
    unit = f"sdbox-test-{token()}.service"
    out = lines(
        box,
        ["systemd-run", "--wait", "--pipe", "--quiet", f"--unit={unit}", "--"]
        + ["sh", "-c", "echo hello; cat /proc/self/cgroup"],
    )
    assert out[0] == "hello"
    assert cgroup_line(out).endswith(f"/{unit}")


def test_a_transient_scope_takes_an_entered_process(box: Box | HostSystemd) -> None:
    scope = f"sdbox-test-{token()}.scope"
    out = lines(
        box,
        ["systemd-run", "--scope", "--quiet", f"--unit={scope}", "--", "cat", "/proc/self/cgroup"],
    )
    assert cgroup_line(out).endswith(f"/{scope}")


def test_inner_pid_is_the_host_pid_of_the_command(box: Box | HostSystemd) -> None:
    proc = box.popen(["sleep", "60"])
    try:
        pid = box.inner_pid(proc)
        assert Path(f"/proc/{pid}/comm").read_text().strip() == "sleep"
    finally:
        os.kill(box.inner_pid(proc), signal.SIGKILL)
        proc.wait(timeout=10)


def test_commands_run_in_the_given_directory(box: Box | HostSystemd) -> None:
    getcwd = ["python3", "-c", "import os; print(os.getcwd())"]
    assert lines(box, getcwd) == [os.getcwd()]
    assert box.run(getcwd, cwd="/", capture_output=True).stdout == "/\n"
    name = f"sdbox-cwd-{token()}"
    box.run(["touch", name], cwd="/tmp", check=True)
    try:
        assert (Path("/tmp") / name).exists() == isinstance(box, HostSystemd)
    finally:
        (Path("/tmp") / name).unlink(missing_ok=True)


def test_cli_runs_the_command_and_returns_its_status() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "sdbox", "run", "--", "sh", "-c", "pwd; exit 7"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 7, result.stderr
    assert result.stdout.strip() == str(REPO)
    if not host_systemd_running():
        assert result.stderr.startswith("sdbox: systemd booted in ")


def test_cli_passes_sigterm_on_to_the_command() -> None:
    child = (
        "import signal, sys, time\n"
        "signal.signal(signal.SIGTERM, lambda *a: sys.exit(42))\n"
        "print('ready', flush=True)\n"
        "time.sleep(60)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "sdbox", "run", "--", sys.executable, "-c", child],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 42


@box_only
def test_cli_passes_on_a_signal_sent_while_the_command_starts() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "sdbox", "run", "--", "sleep", "60"],
        cwd=REPO,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    assert proc.stderr.readline().startswith("sdbox: systemd booted in ")
    proc.send_signal(signal.SIGTERM)  # before, or just as, sleep starts
    assert proc.wait(timeout=30) == 128 + signal.SIGTERM


# -- the box itself


@box_only
def test_the_box_has_its_own_dev_run_and_tmp(box: Box) -> None:
    mounts = lines(box, ["findmnt", "-n", "-o", "TARGET,FSTYPE,SOURCE", "/dev"])
    mounts += lines(box, ["findmnt", "-n", "-o", "TARGET,FSTYPE,SOURCE", "/run"])
    mounts += lines(box, ["findmnt", "-n", "-o", "TARGET,FSTYPE,SOURCE", "/tmp"])
    assert [m.split() for m in mounts] == [
        ["/dev", "tmpfs", "sdbox"],
        ["/run", "tmpfs", "sdbox"],
        ["/tmp", "tmpfs", "sdbox"],
    ]


@box_only
def test_the_hosts_tmp_survives_a_box(box: Box) -> None:
    marker = Path("/tmp") / f"sdbox-marker-{token()}"
    marker.write_text("still here\n")
    try:
        with Box() as other:
            assert other.run(["test", "-e", str(marker)], cwd="/").returncode == 1
        assert marker.read_text() == "still here\n"
    finally:
        marker.unlink()


@box_only
def test_teardown_kills_systemd_and_removes_the_cgroup() -> None:
    with Box() as booted:
        pid, cgroup = booted.pid, booted.cgroup
        assert cgroup is not None and cgroup.is_dir()
        assert Path(f"/proc/{pid}/comm").read_text().strip() == "systemd"
    assert not Path(f"/proc/{pid}").exists()
    assert not cgroup.exists()
    assert not booted.state_dir.exists()


@box_only
def test_two_boxes_run_side_by_side() -> None:
    unit = f"sdbox-test-{token()}.service"
    with Box() as first, Box() as second:
        assert first.pid != second.pid
        assert lines(first, ["hostname"]) == [first.hostname]
        assert lines(second, ["hostname"]) == [second.hostname]
        first.run(["systemd-run", f"--unit={unit}", "--", "sleep", "60"], check=True)
        assert first.run(["systemctl", "is-active", unit]).returncode == 0
        assert second.run(["systemctl", "is-active", unit]).returncode != 0


@box_only
def test_binds_files_and_wants(scratch_dir: Path) -> None:
    files = {
        "etc/systemd/system/sdbox-hello.service": (
            "[Service]\nType=oneshot\nRemainAfterExit=yes\nExecStart=/bin/true\n"
        ),
        "etc/sdbox-test.conf": "from files\n",
    }
    with Box(binds=[scratch_dir], files=files, wants=["sdbox-hello.service"]) as booted:
        assert lines(booted, ["cat", "/etc/sdbox-test.conf"]) == ["from files"]
        assert lines(booted, ["systemctl", "is-active", "sdbox-hello.service"]) == ["active"]
        (scratch_dir / "late").write_text("written after boot\n")
        assert lines(booted, ["cat", str(scratch_dir / "late")]) == ["written after boot"]
        booted.run(["sh", "-c", "echo from inside >inside"], cwd=str(scratch_dir), check=True)
    assert (scratch_dir / "inside").read_text() == "from inside\n"
    assert not Path("/etc/sdbox-test.conf").exists()


@box_only
@pytest.mark.parametrize("path", ["/", "/tmp", "/run/user", "/dev/null", "/proc/self"])
def test_binds_the_box_mounts_afresh_are_refused(path: str) -> None:
    with pytest.raises(BoxError, match="afresh"):
        Box(binds=[path])


@box_only
def test_a_failed_boot_raises_with_the_reason_and_cleans_up() -> None:
    # oneshot: its start job (part of the boot) ends only when /bin/false has failed.
    files = {
        "etc/systemd/system/sdbox-bad.service": "[Service]\nType=oneshot\nExecStart=/bin/false\n"
    }
    failing = Box(files=files, wants=["sdbox-bad.service"])
    with pytest.raises(BoxError, match="degraded; failed units: sdbox-bad.service"):
        failing.__enter__()
    assert not (cgroup2_root() / failing.hostname).exists()
    assert not failing.state_dir.exists()


@box_only
def test_stale_box_cgroups_are_removed_and_live_ones_kept(box: Box) -> None:
    stale = cgroup2_root() / f"{PREFIX}stale-{token()}"
    stale.mkdir()
    _state_dir(stale.name.removeprefix(PREFIX)).mkdir()
    removed = clean_stale_boxes(cgroup2_root(), min_age=0, pattern=stale.name.removeprefix(PREFIX))
    assert stale.name in removed
    assert not stale.exists()
    assert not _state_dir(stale.name.removeprefix(PREFIX)).exists()
    assert box.cgroup is not None and box.cgroup.is_dir()


@box_only
def test_a_killed_cli_takes_its_box_down() -> None:
    name = f"killed-{token()}"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "sdbox",
            "run",
            "--name",
            name,
            "--",
            "sh",
            "-c",
            "echo up; sleep 60",
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "up"
    events = cgroup2_root() / f"{PREFIX}{name}" / "cgroup.events"
    assert "populated 1" in events.read_text()
    proc.kill()
    proc.wait()
    # PR_SET_PDEATHSIG: unshare dies with sdbox, and takes the box's PID 1 with it.
    assert wait_for(lambda: "populated 0" in events.read_text())
    assert clean_stale_boxes(cgroup2_root(), min_age=0, pattern=name) == [f"{PREFIX}{name}"]
    assert not events.parent.exists()
