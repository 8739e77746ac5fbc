"""Finding the user's bus (and so their user manager), as sd-bus finds it.

sd-bus looks at `DBUS_SESSION_BUS_ADDRESS`, then `$XDG_RUNTIME_DIR/bus`. Under
`srun`, `sudo -u` or `su` `XDG_RUNTIME_DIR` is often unset while the user
manager runs: then `/run/user/UID/bus` is the bus (sd-bus's own fallback), and
gpulaunch sets both variables for itself and the ranks, as a login would.
"""

from __future__ import annotations

import os
import stat
from collections.abc import MutableMapping

from gpulaunch.errors import NoSystemdError

LINGER_HINT = (
    "run `loginctl enable-linger $USER` (your user manager then runs without a login "
    "session), or log in through a session that starts user@{uid}.service; as root, use --system"
)


def _is_socket(path: str) -> bool:
    try:
        return stat.S_ISSOCK(os.stat(path).st_mode)
    except OSError:
        return False


def ensure_user_bus(environ: MutableMapping[str, str] | None = None, uid: int | None = None) -> str:
    """The user bus's address; sets the variables sd-bus needs where they were unset.

    Raises NoSystemdError (one line: what is missing, what to do) when no bus is there.
    """
    env = os.environ if environ is None else environ
    uid = os.getuid() if uid is None else uid
    hint = LINGER_HINT.format(uid=uid)
    address = env.get("DBUS_SESSION_BUS_ADDRESS")
    if address:
        path = address.removeprefix("unix:path=").split(",")[0]
        if address.startswith("unix:path=") and not _is_socket(path):
            raise NoSystemdError(
                f"cannot reach your systemd user manager: DBUS_SESSION_BUS_ADDRESS names "
                f"{path}, which is not a socket (is your user manager running?)",
                hint,
            )
        return address
    runtime = env.get("XDG_RUNTIME_DIR")
    if runtime:
        path = f"{runtime}/bus"
        if not _is_socket(path):
            raise NoSystemdError(
                f"cannot reach your systemd user manager: there is no bus at {path} "
                "(XDG_RUNTIME_DIR), so it does not run for you",
                hint,
            )
        return f"unix:path={path}"  # sd-bus finds it there itself
    else:
        runtime = f"/run/user/{uid}"
        path = f"{runtime}/bus"
        if not _is_socket(path):
            raise NoSystemdError(
                f"cannot reach your systemd user manager: XDG_RUNTIME_DIR is unset and "
                f"there is no bus at {path}, so it does not run for you",
                hint,
            )
        env["XDG_RUNTIME_DIR"] = runtime
    address = f"unix:path={path}"
    env["DBUS_SESSION_BUS_ADDRESS"] = address
    return address
