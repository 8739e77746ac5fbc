"""Finding the user's manager: on the user bus as sd-bus finds it, else on its private socket.

sd-bus looks at `DBUS_SESSION_BUS_ADDRESS`, then `$XDG_RUNTIME_DIR/bus`. Under
`srun`, `sudo -u` or `su` `XDG_RUNTIME_DIR` is often unset while the user
manager runs: then `/run/user/UID/bus` is the bus (sd-bus's own fallback), and
gpulaunch sets both variables for itself and the ranks, as a login would.

A user bus exists only where something provides one (Debian's and Ubuntu's
`dbus-user-session`, a desktop); a minimal server's SSH user has a running
`user@UID.service` and no `/run/user/UID/bus`. The manager still listens on
`$XDG_RUNTIME_DIR/systemd/private` (D-Bus, peer to peer, no bus daemon: what
`systemctl --user` uses): everything of systemd's that needs no bus name works
there (issue 29). A bus socket that exists but refuses connections (a stopped
`dbus.socket` leaves its file behind) is no bus, like a missing one.
"""

from __future__ import annotations

import errno
import os
import socket
import stat
from collections.abc import MutableMapping
from dataclasses import dataclass

from gpulaunch.errors import NoSystemdError

LINGER_HINT = (
    "run `loginctl enable-linger $USER` (your user manager then runs without a login "
    "session), or log in through a session that starts user@{uid}.service; as root, use --system"
)
# What a job misses without a user bus, and what gives one: one line, for the start and doctor.
NO_BUS_LINE = (
    "no user bus: {why}; the job runs under your user manager through its private socket, "
    "but is not published on D-Bus (gpulaunch status, wait and stop read its record file and "
    "the journal); install dbus-user-session for the live job API"
)


@dataclass(frozen=True)
class UserManager:
    """Where the user manager answers.

    `peer`: on its private socket, with no bus daemon between us: no bus names
    (no `Type=dbus` service, no published job); `no_bus` says why there is no bus.
    """

    address: str
    peer: bool = False
    no_bus: str = ""

    @property
    def path(self) -> str:
        """The socket's path (a `unix:path=` address)."""
        return self.address.removeprefix("unix:path=").split(",")[0]


def _is_socket(path: str) -> bool:
    try:
        return stat.S_ISSOCK(os.stat(path).st_mode)
    except OSError:
        return False


def socket_problem(path: str) -> str | None:
    """None when a stream socket at `path` takes a connection, else what is wrong, in words.

    Connecting and closing at once costs the listener nothing (sd-bus and the bus
    daemon drop a client that never authenticates).
    """
    if not os.path.lexists(path):
        return f"there is no {path}"
    if not _is_socket(path):
        return f"{path} is not a socket"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    sock.settimeout(2.0)
    try:
        sock.connect(path)
    except OSError as exc:
        if exc.errno == errno.ECONNREFUSED:
            return (
                f"{path} refuses connections: nothing listens "
                "(a stopped dbus.socket leaves its file)"
            )
        return f"{path}: {exc.strerror or exc}"
    finally:
        sock.close()
    return None


def private_socket(runtime: str) -> str:
    """The user manager's own socket (systemd: `$XDG_RUNTIME_DIR/systemd/private`)."""
    return f"{runtime}/systemd/private"


def find_user_manager(
    environ: MutableMapping[str, str] | None = None, uid: int | None = None
) -> UserManager:
    """The user manager's address: its bus, else its private socket.

    Sets the variables sd-bus needs where they were unset (`XDG_RUNTIME_DIR`, and
    `DBUS_SESSION_BUS_ADDRESS` for a bus found through the fallback). Raises
    NoSystemdError (one line: what is missing, what to do) when neither answers.
    """
    env = os.environ if environ is None else environ
    uid = os.getuid() if uid is None else uid
    hint = LINGER_HINT.format(uid=uid)
    runtime = env.get("XDG_RUNTIME_DIR") or ""
    address = env.get("DBUS_SESSION_BUS_ADDRESS")
    if address and not address.startswith("unix:path="):
        return UserManager(address)  # abstract or tcp: sd-bus's business
    if address:
        bus = address.removeprefix("unix:path=").split(",")[0]
        where = f"{bus} (DBUS_SESSION_BUS_ADDRESS)"
    else:
        bus = f"{runtime or f'/run/user/{uid}'}/bus"
        where = bus if runtime else f"{bus} (XDG_RUNTIME_DIR is unset)"
    no_bus = socket_problem(bus)
    if no_bus is None:
        if address:
            return UserManager(address)
        if not runtime:  # sd-bus's fallback: say it for ourselves and the ranks, as a login
            env["XDG_RUNTIME_DIR"] = f"/run/user/{uid}"
            env["DBUS_SESSION_BUS_ADDRESS"] = f"unix:path={bus}"
        return UserManager(f"unix:path={bus}")  # sd-bus finds it there itself
    runtime = runtime or f"/run/user/{uid}"
    private = private_socket(runtime)
    if socket_problem(private) is None:
        env.setdefault("XDG_RUNTIME_DIR", runtime)
        return UserManager(f"unix:path={private}", peer=True, no_bus=no_bus)
    raise NoSystemdError(
        f"cannot reach your systemd user manager: no bus at {where} and nothing answers on "
        f"{private}, so it does not run for you",
        hint,
    )


def user_private_socket() -> str | None:
    """The user manager's private socket where there is no user bus (pystemd then uses it)."""
    try:
        found = find_user_manager()
    except NoSystemdError:
        return None  # sd-bus's own connection then fails with its own words
    return found.path if found.peer else None
