"""dbus_fast on the user manager's private socket: the handshake as sd-bus does it.

systemd's private socket is D-Bus peer to peer: sd-bus on the server side, no
bus daemon. dbus_fast's handshake waits for `AGREE_UNIX_FD`, then sends
`BEGIN` and its first message (`Hello`) back to back; when both arrive in one
read, systemd 252 finishes the handshake with the message already in its
buffer and does not look at it until more bytes come: the `Hello` goes
unanswered and the connection times out (seen in 3 of 5 tries). sd-bus's own
clients (`systemctl --user`, pystemd) send `AUTH`, `NEGOTIATE_UNIX_FD` and
`BEGIN` in one write and their first message only after the server's answers:
so does `PeerBus`. systemd answers the `Hello` with an error (it is no bus),
which dbus_fast takes as its unique name; nothing here uses that name.
"""

from __future__ import annotations

import os

from dbus_fast.aio import MessageBus
from dbus_fast.errors import AuthError

_MAX_REPLY = 4096


class PeerBus(MessageBus):
    """A dbus_fast connection to a peer that speaks sd-bus's server side (fds negotiated)."""

    async def _inner_authenticate(self) -> None:
        sock = self._sock
        assert sock is not None  # connected before the handshake
        uid = str(os.getuid()).encode().hex()
        hello = f"\0AUTH EXTERNAL {uid}\r\nNEGOTIATE_UNIX_FD\r\nBEGIN\r\n".encode()
        await self._loop.sock_sendall(sock, hello)
        reply = b""
        while not reply.endswith(b"AGREE_UNIX_FD\r\n"):
            chunk = await self._loop.sock_recv(sock, _MAX_REPLY)
            reply += chunk
            if not chunk or b"REJECTED" in reply or b"ERROR" in reply or len(reply) > _MAX_REPLY:
                raise AuthError(f"the peer refused us: {reply.decode(errors='replace').strip()}")
