"""The ordinary user of the `frontend` launcher, and where their command runs.

Made once per benchmark run, in the box only (it adds a user): `useradd`, lingering
(`loginctl enable-linger`) and its user manager started, /root made traversable
(inside the box's overlay: the venv's Python lives under /root), the scratch
directory open to them. The user's command runs in a `session-*.scope` of root's
`user-UID.slice`, where sshd with pam_systemd puts a login shell
(tests/integration/test_frontend.py does the same).
"""

from __future__ import annotations

import os
import pwd
import subprocess
import time
from pathlib import Path

USER = "glbench"


class Unavailable(Exception):
    """The front end cannot be measured here; the message says why."""


def _ids() -> tuple[int, int]:
    entry = pwd.getpwnam(USER)
    return entry.pw_uid, entry.pw_gid


def ids() -> tuple[int, int]:
    """The user's uid and gid."""
    return _ids()


def restart_manager() -> None:
    """Start the user's manager again after a soak job stopped it (their logout, a stop)."""
    uid, _ = _ids()
    _run("systemctl", "start", f"user@{uid}.service")
    _wait_bus(uid)


def prepare(scratch: Path, in_box: bool) -> None:
    """Make the user and start their manager; raises Unavailable with the reason."""
    if os.geteuid() != 0:
        raise Unavailable("needs root (it adds a user and starts their manager)")
    if not in_box:
        raise Unavailable("runs only in the project's box: it would add a user to this host")
    try:
        pwd.getpwnam(USER)
    except KeyError:
        _run("useradd", "--create-home", USER)
    _run("chmod", "711", "/root")  # the box's overlay only
    uid, _ = _ids()
    # Lingering, as on a shared node where users run jobs: without it logind stops the
    # user manager a few seconds after the user's last process is gone, between two runs.
    _run("loginctl", "enable-linger", USER)
    _run("systemctl", "start", f"user@{uid}.service")
    _wait_bus(uid)
    scratch.chmod(0o777)


def _wait_bus(uid: int) -> None:
    bus = Path(f"/run/user/{uid}/bus")
    deadline = time.monotonic() + 30
    while not bus.exists():  # socket-activated by the manager's sockets.target
        if time.monotonic() > deadline:
            raise Unavailable(f"{USER}'s user manager runs but {bus} did not appear in 30 s")
        time.sleep(0.1)


def _run(*argv: str) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise Unavailable(f"`{' '.join(argv)}` failed: {done.stderr.strip()[-300:]}")


def prefix(token: str) -> list[str]:
    """What goes before `gpulaunch start`: a fresh login session's scope, then the user."""
    uid, gid = _ids()
    return [
        "systemd-run", "--quiet", "--scope", f"--slice=user-{uid}.slice",
        f"--unit=session-{token}", "setpriv", f"--reuid={uid}", f"--regid={gid}",
        "--init-groups",
    ]  # fmt: skip


def login_environment() -> dict[str, str]:
    """What a login gives the user's shell (and gpulaunch reads): home, names, runtime dir."""
    entry = pwd.getpwnam(USER)
    return {
        "HOME": entry.pw_dir,
        "USER": USER,
        "LOGNAME": USER,
        "XDG_RUNTIME_DIR": f"/run/user/{entry.pw_uid}",
    }
