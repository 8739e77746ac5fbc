"""`gpulaunch setup` under a --root, `gpulaunch doctor`'s checks on fake trees, --version."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpulaunch import __version__
from gpulaunch.cli import main
from gpulaunch.model import Manager
from gpulaunch.system import cgroupchecks, checks, doctor
from gpulaunch.system.files import (
    ALL,
    BUS_POLICY,
    JOURNALD_DROP_IN,
    SYSTEM_SLICE,
    TMPFILES,
    USER_SLICE,
)
from gpulaunch.system.findings import Finding, Machine, Status

REPO = Path(__file__).resolve().parents[2]


def gl(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exit_:
        main(list(argv))
    out, err = capsys.readouterr()
    return int(exit_.value.code or 0), out, err


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert gl(capsys, "--version") == (0, f"gpulaunch {__version__}\n", "")


def test_the_shipped_files_exist() -> None:
    for file in ALL:
        assert file.source.is_file(), file.source
        # one source: the repository's packaging/ (a wheel's copy of it when installed)
        assert file.source.is_relative_to(Path(__file__).parents[2] / "packaging"), file.source


def test_setup_installs_idempotently_and_uninstalls(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = str(tmp_path)
    policy, drop_in = BUS_POLICY.at(tmp_path), JOURNALD_DROP_IN.at(tmp_path)
    defaults = [f.at(tmp_path) for f in (SYSTEM_SLICE, USER_SLICE, TMPFILES)]
    code, out, _ = gl(capsys, "setup", "--root", root)
    assert code == 0 and out.splitlines() == [
        f"gpulaunch setup: installed {path}" for path in (policy, *defaults)
    ]
    assert policy.read_bytes() == BUS_POLICY.source.read_bytes()
    assert all(path.read_bytes() == SYSTEM_SLICE.source.read_bytes() for path in defaults[:2])
    assert not drop_in.exists()  # only with --journald
    code, out, _ = gl(capsys, "setup", "--root", root, "--journald")
    assert out.splitlines() == [
        *(f"gpulaunch setup: unchanged {path}" for path in (policy, *defaults)),
        f"gpulaunch setup: installed {drop_in}",
    ]
    policy.write_text("<busconfig/>")  # an older version
    code, out, _ = gl(capsys, "setup", "--root", root, "--journald")
    assert f"updated {policy}" in out and f"unchanged {drop_in}" in out
    code, out, _ = gl(capsys, "setup", "--root", root, "--journald")
    assert out.splitlines()[-1] == "gpulaunch setup: nothing to change"
    code, out, _ = gl(capsys, "setup", "--root", root, "--uninstall")
    assert code == 0 and f"removed {policy}" in out and f"removed {drop_in}" in out
    assert not policy.exists() and not drop_in.exists()
    assert not any(path.exists() for path in defaults)


def test_setup_on_the_machine_needs_root() -> None:
    argv = [sys.executable, "-m", "gpulaunch", "setup"]
    if os.geteuid() == 0:  # as an ordinary user
        argv = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *argv]
    res = subprocess.run(argv, capture_output=True, text=True, cwd=REPO, check=False)
    assert res.returncode == 77, res.stderr
    assert res.stderr == (
        "gpulaunch: error: gpulaunch setup writes into /etc; run it as root: sudo gpulaunch setup\n"
    )


def test_setup_with_an_empty_root_is_one_line_and_installs_nothing(tmp_path: Path) -> None:
    """Issue 35: `setup --root ''` installed into the current directory (Path("") is ".")
    and exited 0 without a word."""
    res = subprocess.run(
        [sys.executable, "-m", "gpulaunch", "setup", "--root", ""],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        check=False,
    )
    assert res.returncode == 2, res.stderr
    assert res.stderr.startswith("gpulaunch: error: argument --root: an empty path"), res.stderr
    assert res.stderr.count("\n") == 1, res.stderr
    assert "Traceback" not in res.stderr and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("30s", 30.0),
        ("30", 30.0),
        ("1min 30s", 90.0),
        ("500ms", 0.5),
        ("0", 0.0),
        ("x", None),
        # the doctor once called these "unreadable" (its own parser knew no days or hr)
        ("1d", 86400.0),
        ("2hr", 7200.0),
        ("1h 30min", 5400.0),
        ("infinity", float("inf")),
        ("-5s", None),
    ],
)
def test_timespan_seconds(text: str, seconds: float | None) -> None:
    assert checks.timespan_seconds(text) == seconds


@pytest.mark.parametrize(
    ("available", "burst"),
    [(1 << 20, 10000), (16 << 20, 20000), (4 << 30, 40000), (128 << 30, 52500)],
)
def test_journald_scales_the_burst_with_free_space(available: int, burst: int) -> None:
    assert checks.modulated_burst(10000, available) == burst


def machine(tmp_path: Path, manager: Manager = Manager.SYSTEM, **kw: object) -> Machine:
    return Machine(manager=manager, uid=1000, root=tmp_path, **kw)  # type: ignore[arg-type]


def test_journald_with_the_drop_in_keeps_everything(tmp_path: Path) -> None:
    (finding,) = checks.journald(machine(tmp_path))
    assert finding.status is Status.WARN and "10000 lines per 30s" in finding.detail
    assert "keeps 3.3%" in finding.detail and "--journald" in finding.fix
    target = JOURNALD_DROP_IN.at(tmp_path)
    target.parent.mkdir(parents=True)
    target.write_bytes(JOURNALD_DROP_IN.source.read_bytes())
    (finding,) = checks.journald(machine(tmp_path))
    assert finding.status is Status.OK and "keeps 100.0%" in finding.detail


@pytest.mark.parametrize("interval", ["1d", "2hr"])
def test_the_doctor_reads_journald_intervals_as_systemd_does(interval: str, tmp_path: Path) -> None:
    """Once "unreadable": the doctor's own parser knew no days and no `hr`."""
    write(
        tmp_path / "etc/systemd/journald.conf.d/x.conf",
        f"[Journal]\nRateLimitIntervalSec={interval}\nRateLimitBurst=5\n",
    )
    (finding,) = checks.journald(machine(tmp_path))
    assert "unreadable" not in finding.detail and "5 lines per" in finding.detail, finding.detail


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_cgroups_say_what_is_enforced(tmp_path: Path) -> None:
    write(tmp_path / "sys/fs/cgroup/cgroup.controllers", "cpuset cpu io memory pids\n")
    user = tmp_path / "sys/fs/cgroup/user.slice/user-1000.slice/user@1000.service"
    write(user / "cgroup.controllers", "cpu memory pids\n")
    system = {f.item: f for f in cgroupchecks.cgroups(machine(tmp_path))}
    assert all(f.status is Status.OK for f in system.values()), system
    mine = {f.item: f for f in cgroupchecks.cgroups(machine(tmp_path, Manager.USER))}
    assert mine["--memory-max"].status is Status.OK
    assert mine["--cpus-per-rank"].status is Status.WARN
    assert "not enforced" in mine["--cpus-per-rank"].detail and "Delegate=cpuset" in (
        mine["--cpus-per-rank"].fix
    )
    assert mine["--gpu-isolation"].status is Status.WARN


def test_no_cgroup2_means_limits_are_not_enforced(tmp_path: Path) -> None:
    (finding,) = cgroupchecks.cgroups(machine(tmp_path))
    assert finding.status is Status.WARN and "not enforced" in finding.detail


def test_fd_limits_count_ranks(tmp_path: Path) -> None:
    # The watcher raises its soft limit to the hard one: only the hard one bounds a job.
    (low,) = checks.fd_limits(machine(tmp_path, nofile=(256, 256)))
    assert low.status is Status.WARN and "LimitNOFILE=" in low.fix
    assert f"hard 256 (~{checks.ranks_allowed(256)} ranks" in low.detail
    (raised,) = checks.fd_limits(machine(tmp_path, nofile=(1024, 4096)))
    assert raised.status is Status.OK
    (high,) = checks.fd_limits(machine(tmp_path, nofile=(65536, 65536)))
    assert high.status is Status.OK


def test_bus_policy_and_user_jobs(tmp_path: Path) -> None:
    (missing,) = checks.bus_policy(machine(tmp_path))
    assert missing.status is Status.WARN and missing.fix == "sudo gpulaunch setup"
    (for_users,) = checks.bus_policy(machine(tmp_path, Manager.USER))
    assert for_users.status is Status.INFO  # user jobs publish on their own bus
    write(tmp_path / "run/user/1000/.keep", "")
    found = list(
        checks.user_jobs(machine(tmp_path, Manager.USER, env={"XDG_RUNTIME_DIR": "/run/user/1000"}))
    )
    assert [f.status for f in found] == [Status.OK, Status.WARN]
    assert found[1].fix.startswith("loginctl enable-linger ")
    (unset,) = [
        f for f in checks.user_jobs(machine(tmp_path, Manager.USER)) if f.item == "XDG_RUNTIME_DIR"
    ]
    assert unset.status is Status.WARN  # start runs there (issue 22 item 8)


def test_gpus_from_the_driver_tree(tmp_path: Path) -> None:
    write(
        tmp_path / "proc/driver/nvidia/version",
        "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.14  Thu Feb 22\n",
    )
    found = {f.item: f for f in checks.nvidia(machine(tmp_path))}
    assert found["NVIDIA driver"].detail == "550.54.14"
    assert found["GPUs"].status is Status.INFO  # no GPU directories in the fake tree


def test_supervisors_pick_the_first_that_can_run(tmp_path: Path) -> None:
    m = machine(tmp_path)
    ok = checks.systemd_supervisor(m, None)
    rows = list(checks.supervisors(m, [ok]))
    assert rows[0] == Finding("supervisor", "a job gets", Status.OK, f"systemd: {ok.why}")
    down = checks.Verdict("systemd", False, "no manager")
    rows = list(checks.supervisors(m, [down]))
    assert rows[0].status is Status.FAIL and not doctor.can_run(rows)


def test_doctor_table_and_json() -> None:
    findings = [
        Finding("supervisor", "a job gets", Status.OK, "systemd: the system manager answers"),
        Finding(
            "journald", "rate limit", Status.WARN, "keeps 3.3%", "sudo gpulaunch setup --journald"
        ),
    ]
    table = doctor.format_table(findings)
    lines = table.splitlines()
    assert lines[0].split() == ["area", "check", "status", "found"]
    assert lines[3].strip() == "fix: sudo gpulaunch setup --journald"
    assert lines[-1] == "gpulaunch doctor: a job can run here"
    data = doctor.as_json(findings)
    assert data["can_run"] is True and data["supervisor"] == "systemd"
    assert json.loads(json.dumps(data))["checks"][1]["status"] == "warn"


def test_the_shipped_slice_is_valid_with_every_default_set() -> None:
    """packaging/systemd/gpulaunch.slice: what an admin uncomments is a valid setting."""
    from gpulaunch.units.codec import parse_unit

    text = SYSTEM_SLICE.source.read_text()
    assert parse_unit(text, "slice", "gpulaunch.slice")  # Description=, Before=, ...
    section = text.split("[Slice]\n")[1].splitlines()
    tuned = "\n".join(line.removeprefix("#") for line in section if "=" in line)
    props = {p.name for p in parse_unit(f"[Slice]\n{tuned}", "slice", "-")}
    assert {"MemoryMaxScale", "CPUWeight", "IOWeight", "TasksMax"} <= props, props  # 90%: a scale


def test_user_bus_says_which_this_machine_has(tmp_path: Path) -> None:
    """A user bus; none but the manager's private socket (a minimal server, issue 29)."""
    import socket

    def listening(path: Path) -> socket.socket:
        path.parent.mkdir(parents=True, exist_ok=True)
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(str(path))
        sock.listen()
        return sock

    env = {"XDG_RUNTIME_DIR": str(tmp_path)}
    user = machine(tmp_path, Manager.USER, env=env)
    assert list(checks.user_bus(machine(tmp_path, env=env))) == []  # root: no user bus needed
    with listening(tmp_path / "systemd" / "private"):
        (row,) = checks.user_bus(user)
        assert row.status is Status.WARN and "no job API on D-Bus" in row.detail
        assert f"there is no {tmp_path}/bus" in row.detail and "dbus-user-session" in row.fix
        with listening(tmp_path / "bus"):
            (row,) = checks.user_bus(user)
            assert row.status is Status.OK and row.detail.startswith(f"{tmp_path}/bus")
    (row,) = checks.user_bus(user)  # neither answers: the manager's row fails; this one says it
    assert row.status is Status.INFO and "cannot reach your systemd user manager" in row.detail


def test_cgroups_under_the_direct_supervisor_say_what_it_does(tmp_path: Path) -> None:
    """A container with a read-only cgroup: the supervisor row says "no limits", and so do
    the cgroups rows now (they said "enforced" from the host's controllers)."""
    none = {f.item: f for f in cgroupchecks.direct_cgroups(None, "/sys/fs/cgroup is not writable")}
    assert set(none) == {"--memory-max", "--cpus-per-rank", "--gpu-isolation"}
    assert all(f.status is Status.WARN for f in none.values())
    assert "process groups" in none["--memory-max"].detail
    assert "unmask=/sys/fs/cgroup" in none["--memory-max"].fix
    write(tmp_path / "cgroup.controllers", "cpu memory pids\n")
    own = {f.item: f for f in cgroupchecks.direct_cgroups(tmp_path, "")}
    assert own["--memory-max"].status is Status.OK and "direct" in own["--memory-max"].detail
    assert own["--cpus-per-rank"].status is Status.WARN
    assert own["--gpu-isolation"].status is Status.WARN
