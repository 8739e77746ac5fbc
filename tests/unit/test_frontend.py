"""The front end's pure parts: when it is needed, the user bus, the watcher's service."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from gpulaunch.base.names import UnitNames, unit_object_path
from gpulaunch.base.userbus import UserManager, find_user_manager, socket_problem
from gpulaunch.errors import NoSystemdError
from gpulaunch.frontend.need import needs_frontend, own_cgroup
from gpulaunch.frontend.unit import (
    environment,
    exit_status,
    watcher_argv,
)
from gpulaunch.model import Manager


@pytest.mark.parametrize(
    "manager,uid,cgroup,needed",
    [
        (Manager.USER, 1001, "/user.slice/user-1001.slice/session-3.scope", True),
        (Manager.USER, 1001, "/system.slice/slurmstepd.scope/job_7/step_0", True),
        (Manager.USER, 1001, "/", True),
        (Manager.USER, 1001, "/user.slice/user-1001.slice/user@1001.service/app.slice/x", False),
        (Manager.USER, 1001, "/user.slice/user-1001.slice/user@1001.service", False),
        (Manager.USER, 1001, "/user.slice/user-1002.slice/user@1002.service/app.slice", True),
        (Manager.USER, 0, "/user.slice/user-0.slice/session-1.scope", False),
        (Manager.SYSTEM, 1001, "/user.slice/user-1001.slice/session-3.scope", False),
    ],
)
def test_needs_frontend(manager: Manager, uid: int, cgroup: str, needed: bool) -> None:
    assert needs_frontend(manager, uid=uid, cgroup=cgroup) is needed


def test_own_cgroup(tmp_path: Path) -> None:
    f = tmp_path / "cgroup"
    f.write_text("1:name=systemd:/x\n0::/user.slice/a.scope\n")
    assert own_cgroup(f) == "/user.slice/a.scope"
    f.write_text("1:cpu:/\n")
    assert own_cgroup(f) is None
    assert own_cgroup(tmp_path / "missing") is None


def test_user_bus_fallback_to_run_user(tmp_path: Path) -> None:
    env: dict[str, str] = {}
    with pytest.raises(NoSystemdError) as exc:
        find_user_manager(env, uid=4242424)
    assert "XDG_RUNTIME_DIR is unset" in exc.value.message
    assert "/run/user/4242424/bus" in exc.value.message
    assert "/run/user/4242424/systemd/private" in exc.value.message
    assert exc.value.hint is not None and "loginctl enable-linger" in exc.value.hint
    assert env == {}


def _listening(path: Path) -> socket.socket:
    path.parent.mkdir(parents=True, exist_ok=True)
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(path))
    sock.listen()
    return sock


def test_user_bus_from_xdg_runtime_dir(tmp_path: Path) -> None:
    with _listening(tmp_path / "bus"):
        env = {"XDG_RUNTIME_DIR": str(tmp_path)}
        found = find_user_manager(env, uid=1)
        assert found == UserManager(f"unix:path={tmp_path}/bus")
        assert env == {"XDG_RUNTIME_DIR": str(tmp_path)}  # sd-bus finds it itself
    with pytest.raises(NoSystemdError, match="no bus at"):
        find_user_manager({"XDG_RUNTIME_DIR": str(tmp_path / "nope")}, uid=1)


def test_no_user_bus_but_the_managers_private_socket(tmp_path: Path) -> None:
    """A minimal server's SSH user: no bus, the manager on $XDG_RUNTIME_DIR/systemd/private."""
    with _listening(tmp_path / "systemd" / "private"):
        env = {"XDG_RUNTIME_DIR": str(tmp_path)}
        found = find_user_manager(env, uid=1)
        assert found.peer and found.path == f"{tmp_path}/systemd/private"
        assert found.no_bus == f"there is no {tmp_path}/bus"
        # a stopped dbus.socket leaves its file: it exists and refuses connections
        stale = socket.socket(socket.AF_UNIX)
        stale.bind(str(tmp_path / "bus"))
        stale.close()
        found = find_user_manager(env, uid=1)
        assert found.peer and "refuses connections" in found.no_bus
        assert "dbus.socket" in found.no_bus
        # so does a DBUS_SESSION_BUS_ADDRESS naming it
        env["DBUS_SESSION_BUS_ADDRESS"] = f"unix:path={tmp_path}/bus"
        assert find_user_manager(env, uid=1).peer
    # neither answers: one line naming both
    with pytest.raises(NoSystemdError) as exc:
        find_user_manager(env, uid=1)
    assert "refuses" not in exc.value.message and f"{tmp_path}/systemd/private" in (
        exc.value.message
    )


def test_socket_problem_says_what_is_wrong(tmp_path: Path) -> None:
    assert socket_problem(str(tmp_path / "none")) == f"there is no {tmp_path}/none"
    (tmp_path / "file").write_text("")
    assert socket_problem(str(tmp_path / "file")) == f"{tmp_path}/file is not a socket"
    with _listening(tmp_path / "ok"):
        assert socket_problem(str(tmp_path / "ok")) is None


def test_watcher_argv_keeps_the_script_arguments_apart() -> None:
    argv = ["--debug", "start", "--nproc", "2", "t.py", "--job", "x"]
    assert watcher_argv("/py", argv, "myjob") == [
        "/py", "-m", "gpulaunch", "--debug", "start", "--frontend-child", "--job", "myjob",
        "--nproc", "2", "t.py", "--job", "x",
    ]  # fmt: skip


def test_environment_leaves_out_what_systemd_refuses() -> None:
    kept, dropped = environment({"A": "1", "B": "x\ny", "bad-name": "1", "C": "a\x01b"})
    assert kept == ["A=1", "B=x\ny"]
    assert dropped == ["C", "bad-name"]


def test_unit_object_path_escapes_like_systemd() -> None:
    assert (
        unit_object_path("gpulaunch-a\\x2db-launch.service")
        == "/org/freedesktop/systemd1/unit/gpulaunch_2da_5cx2db_2dlaunch_2eservice"
    )
    assert unit_object_path("1x.service").startswith("/org/freedesktop/systemd1/unit/_31x")


def test_service_name_and_exit_status() -> None:
    # The service's properties: tests/unit/test_service_templates.py (units/launch.service).
    assert UnitNames.for_job("j").launch_service == "gpulaunch-j-launch.service"
    assert exit_status(1, 7) == 7
    assert exit_status(2, 9) == 137
    assert exit_status(0, 0) is None
