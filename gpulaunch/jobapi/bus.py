"""Connecting to the bus a job lives on: the system bus, or the user's session bus.

Shared by the watcher's publisher and every client (gpulaunch/jobapi/client.py),
so that a client loads nothing of the publisher.
"""

from __future__ import annotations

import asyncio
import os
from contextlib import nullcontext

from dbus_fast import BusType, Message
from dbus_fast.aio import MessageBus
from dbus_fast.auth import AuthExternal
from dbus_fast.errors import AuthError, InvalidAddressError

from gpulaunch.errors import NoSystemdError
from gpulaunch.jobapi import whose
from gpulaunch.jobapi.view import bus_title
from gpulaunch.model import Manager

DBUS = "org.freedesktop.DBus"
DBUS_PATH = "/org/freedesktop/DBus"
PROPERTIES = "org.freedesktop.DBus.Properties"
INTROSPECTABLE = "org.freedesktop.DBus.Introspectable"
ACCESS_DENIED = "org.freedesktop.DBus.Error.AccessDenied"
CONNECT_TIMEOUT = 5.0  # seconds to connect and own the name before the job starts


def bus_address(manager: Manager) -> str:
    """The bus a job of this manager lives on, found as sd-bus finds it."""
    if manager is Manager.SYSTEM:
        return os.environ.get("DBUS_SYSTEM_BUS_ADDRESS") or "unix:path=/run/dbus/system_bus_socket"
    other = whose.other()
    if other is not None:  # root, --user-of: that user's bus, never root's own variables
        return other.bus_address
    address = os.environ.get("DBUS_SESSION_BUS_ADDRESS")
    if address:
        return address
    runtime = os.environ.get("XDG_RUNTIME_DIR") or f"/run/user/{os.getuid()}"
    return f"unix:path={runtime}/bus"


async def connect(manager: Manager) -> MessageBus:
    """Connect to the job's bus, or raise NoSystemdError naming it."""
    address = bus_address(manager)
    other = whose.other() if manager is Manager.USER else None
    bus: MessageBus | None = None
    try:
        bus = MessageBus(
            bus_address=address,
            bus_type=BusType.SYSTEM,
            auth=AuthExternal(other.uid) if other is not None else None,
            auth_timeout=CONNECT_TIMEOUT,
        )
        with whose.connecting_as(other) if other is not None else nullcontext():
            return await asyncio.wait_for(bus.connect(), CONNECT_TIMEOUT)
    except (OSError, AuthError, InvalidAddressError, TimeoutError) as exc:
        if bus is not None:
            forget(bus)
        reason = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
        if manager is Manager.SYSTEM:
            hint = "is dbus running? gpulaunch needs the system bus that systemd uses"
        elif other is not None:
            hint = (
                f"{other.name}'s user manager is not running (not logged in, no linger); "
                f"their jobs that ended: gpulaunch status --user-of {other.name} JOB"
            )
        else:
            hint = (
                "log in through a session that starts user@$UID.service (it runs the "
                "session bus), or set DBUS_SESSION_BUS_ADDRESS; as root, use --system"
            )
        raise NoSystemdError(
            f"cannot reach {bus_title(manager)} at {address} ({reason})", hint
        ) from None


def forget(bus: MessageBus) -> None:
    """Let go of a bus whose end nobody awaits: how it ended (EPIPE when the daemon went
    away mid-handshake) is retrieved, never "Future exception was never retrieved"."""
    ended: asyncio.Future[None] = bus._disconnect_future  # noqa: SLF001 (no public hook)
    ended.add_done_callback(_retrieved)


def send(bus: MessageBus, msg: Message) -> asyncio.Future[None] | None:
    """`bus.send`, whose outcome nobody awaits (a lost bus is not the job's problem); None
    when the bus went away under it. Then dbus-fast wrote at once, failed (EPIPE), closed the
    socket and could not watch it (EBADF): the failed future is its writer's last one."""
    try:
        fut: asyncio.Future[None] = bus.send(msg)
    except (OSError, ValueError):
        failed = getattr(getattr(bus, "_writer", None), "fut", None)
        if isinstance(failed, asyncio.Future):
            failed.add_done_callback(_retrieved)
        return None
    fut.add_done_callback(_retrieved)
    return fut


def _retrieved(future: asyncio.Future[None]) -> None:
    if not future.cancelled():
        future.exception()
