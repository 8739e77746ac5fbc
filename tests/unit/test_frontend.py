"""The front end's pure parts: when it is needed, the user bus, the watcher's service."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpulaunch.errors import NoSystemdError
from gpulaunch.frontend.need import needs_frontend, own_cgroup
from gpulaunch.frontend.unit import (
    environment,
    exit_status,
    service_name,
    unit_object_path,
    watcher_argv,
)
from gpulaunch.frontend.userbus import ensure_user_bus
from gpulaunch.model import Manager
from gpulaunch.units.names import UnitNames


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
        ensure_user_bus(env, uid=4242424)
    assert "XDG_RUNTIME_DIR is unset" in exc.value.message
    assert "/run/user/4242424/bus" in exc.value.message
    assert exc.value.hint is not None and "loginctl enable-linger" in exc.value.hint
    assert env == {}


def test_user_bus_from_xdg_runtime_dir(tmp_path: Path) -> None:
    import socket

    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(tmp_path / "bus"))
    env = {"XDG_RUNTIME_DIR": str(tmp_path)}
    assert ensure_user_bus(env, uid=1) == f"unix:path={tmp_path}/bus"
    assert env == {"XDG_RUNTIME_DIR": str(tmp_path)}  # sd-bus finds it itself
    with pytest.raises(NoSystemdError, match="no bus at"):
        ensure_user_bus({"XDG_RUNTIME_DIR": str(tmp_path / "nope")}, uid=1)
    sock.close()


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
    assert service_name(UnitNames.for_job("j")) == "gpulaunch-j-launch.service"
    assert exit_status(1, 7) == 7
    assert exit_status(2, 9) == 137
    assert exit_status(0, 0) is None
