"""The lab itself is what users have: systemd PID 1 on a unified cgroup v2 with every
controller, real SSH logins with pam_systemd session scopes and PAM's limits, a user
manager with delegated controllers and a user bus, the checkout in place."""

from __future__ import annotations

from sdbox.vm import Machine


def test_machine_is_what_users_have(vm: Machine) -> None:
    root = vm.run(
        "cat /proc/1/comm; cat /sys/fs/cgroup/cgroup.controllers; stat -fc %T /sys/fs/cgroup;"
        " systemctl is-system-running; gpulaunch --version",
        check=True,
    ).stdout.split("\n")
    assert root[0] == "systemd", root
    assert {"cpu", "cpuset", "memory", "pids", "io"} <= set(root[1].split()), root
    assert root[2] == "cgroup2fs", root
    assert root[3] == "running", root
    assert root[4].startswith("gpulaunch"), root


def test_ssh_user_gets_session_scope_limits_and_user_manager(vm: Machine) -> None:
    out = vm.run(
        "id -u; ulimit -n; cat /proc/self/cgroup; echo $XDG_RUNTIME_DIR; test -S"
        " $XDG_RUNTIME_DIR/bus && echo bus;"
        " u=$(id -u); cat /sys/fs/cgroup/user.slice/user-$u.slice/user@$u.service/"
        "cgroup.controllers",
        user="alice",
        check=True,
    ).stdout.split("\n")
    uid = out[0]
    assert uid == "1001", out
    assert out[1] == "1024", out  # PAM's soft limit on open files, what login shells get
    assert out[2].startswith(f"0::/user.slice/user-{uid}.slice/session-"), out
    assert out[2].endswith(".scope"), out
    assert out[3] == f"/run/user/{uid}", out
    assert out[4] == "bus", out  # dbus-user-session: the user bus
    assert {"cpu", "memory", "pids"} <= set(out[5].split()), out  # delegated to the user
