"""frontend/peerbus.py against a stand-in for systemd 252's private socket.

The stand-in answers the handshake as sd-bus's server does and, like systemd 252,
never looks at bytes that came in the same read as `BEGIN` (seen on the real
socket: dbus_fast's `Hello` went unanswered in about 3 of 5 connections). It
reads only after a pause, so that whatever the client sent back to back arrives
together: dbus_fast's own handshake then loses its `Hello`, PeerBus's does not.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from pathlib import Path

import pytest
from dbus_fast import Message, MessageType
from dbus_fast.aio import MessageBus

from gpulaunch.frontend.peerbus import PeerBus

PAUSE = 0.2  # seconds the stand-in waits before each read: what was sent by then comes together


def _serve(listener: socket.socket) -> None:
    conn, _ = listener.accept()
    with conn:
        conn.settimeout(5)
        running = False
        while True:
            time.sleep(PAUSE)
            try:
                chunk = conn.recv(65536)
            except OSError:
                return
            if not chunk:
                return
            if running:  # a message after the handshake: systemd has no org.freedesktop.DBus
                error = Message(
                    message_type=MessageType.ERROR,
                    reply_serial=1,
                    error_name="org.freedesktop.DBus.Error.UnknownObject",
                    signature="s",
                    body=["Unknown object '/org/freedesktop/DBus'."],
                )
                conn.sendall(bytes(error._marshall(False)))
                continue
            for line in chunk.lstrip(b"\0").split(b"\r\n"):
                if line.startswith(b"AUTH"):
                    conn.sendall(b"OK 0123456789abcdef0123456789abcdef\r\n")
                elif line == b"NEGOTIATE_UNIX_FD":
                    conn.sendall(b"AGREE_UNIX_FD\r\n")
                elif line == b"BEGIN":
                    running = True  # the rest of this read is never looked at (systemd 252)
                    break


def _connect(kind: type[MessageBus], path: Path) -> bool:
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(path))
    listener.listen()
    server = threading.Thread(target=_serve, args=(listener,), daemon=True)
    server.start()

    async def attempt() -> bool:
        bus = kind(bus_address=f"unix:path={path}", negotiate_unix_fd=True)
        try:
            await asyncio.wait_for(bus.connect(), 2)
        except TimeoutError:
            return False
        finally:
            bus.disconnect()
        return True

    try:
        return asyncio.run(attempt())
    finally:
        listener.close()
        server.join(5)


@pytest.mark.parametrize("kind,connects", [(MessageBus, False), (PeerBus, True)])
def test_the_handshake_sd_bus_servers_need(
    tmp_path: Path, kind: type[MessageBus], connects: bool
) -> None:
    assert _connect(kind, tmp_path / "private") is connects
