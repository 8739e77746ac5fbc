"""Reaching a systemd manager that exists but does not answer yet (issue 22, items 2 and 14).

Right after boot, during a `daemon-reexec` or a restart of its bus, a manager is there
(its socket is) but a connection or a call fails for a moment. Such a failure is asked
again at growing intervals within a bounded time, never taken at once for "no systemd";
where no socket exists, no manager is coming, and the answer is at once.
"""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:  # only its name: the import chain stays short (tests/unit/test_layout.py)
    from gpulaunch.model import Manager

T = TypeVar("T")

WITHIN_S = 5.0  # how long a manager that exists may take to answer again
_FIRST_S = 0.02
_MOST_S = 0.5
PRIVATE_SOCKET = "/run/systemd/private"  # the system manager's own socket


def retry(
    attempt: Callable[[], T],
    transient: tuple[type[BaseException], ...],
    manager: Manager | None = None,
    within: float = WITHIN_S,
) -> T:
    """`attempt()`'s result; a `transient` error is retried while time is left and, if
    `manager` is given, such a manager exists (blocking sleeps: a transient failure has no
    event to wait for); else raised."""
    deadline = time.monotonic() + within
    delay = _FIRST_S
    while True:
        try:
            return attempt()
        except transient:
            gone = manager is not None and not manager_exists(manager)
            if gone or time.monotonic() + delay > deadline:
                raise
        time.sleep(delay)
        delay = min(delay * 2, _MOST_S)


def manager_exists(manager: Manager) -> bool:
    """Whether a manager of this kind exists here, answering or not: its private socket, or
    the bus it is reached on (sd-bus's address), is there."""
    if manager.value == "system":
        if not os.path.isdir("/run/systemd/system"):  # sd_booted(3): systemd is not PID 1
            return False
        sockets = [PRIVATE_SOCKET, _socket_path("DBUS_SYSTEM_BUS_ADDRESS", None)]
    else:
        runtime = os.environ.get("XDG_RUNTIME_DIR") or f"/run/user/{os.getuid()}"
        sockets = [f"{runtime}/systemd/private", _socket_path("DBUS_SESSION_BUS_ADDRESS", runtime)]
    return any(path and stat.S_ISSOCK(_mode(path)) for path in sockets)


def _socket_path(variable: str, runtime: str | None) -> str:
    """The socket of a bus address as sd-bus finds it (a unix:path= one; else nothing)."""
    address = os.environ.get(variable)
    if not address:
        return f"{runtime}/bus" if runtime is not None else "/run/dbus/system_bus_socket"
    first = address.split(";")[0]
    if first.startswith("unix:"):
        for part in first.removeprefix("unix:").split(","):
            if part.startswith("path="):
                return part.removeprefix("path=")
    return ""


def _mode(path: str) -> int:
    try:
        return os.stat(path).st_mode
    except OSError:
        return 0


def root_private_socket() -> str | None:
    """The system manager's own socket, which a restart of the bus daemon leaves alone: root's."""
    return PRIVATE_SOCKET if os.geteuid() == 0 and os.access(PRIVATE_SOCKET, os.W_OK) else None
