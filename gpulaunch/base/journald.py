"""Writing one entry to journald with its native protocol (systemd's "Native Journal
Protocol"): a datagram of `FIELD=value` lines to its socket, a sealed memfd when the
entry is too big for a datagram. The job's record (jobapi/record.py) and a straggler's
entry (progress/journal.py) are written through it.
"""

from __future__ import annotations

import errno
import fcntl
import os
import socket
import struct
from collections.abc import Iterable

JOURNAL_SOCKET = "/run/systemd/journal/socket"


def encode(entry: Iterable[tuple[str, str]]) -> bytes:
    """The native protocol: `KEY=value\\n`; with newlines in it `KEY\\n<u64le length>value\\n`."""
    out = bytearray()
    for key, value in entry:
        data = value.encode("utf-8", "surrogateescape")
        if b"\n" in data:
            out += key.encode() + b"\n" + struct.pack("<Q", len(data)) + data + b"\n"
        else:
            out += key.encode() + b"=" + data + b"\n"
    return bytes(out)


def send(data: bytes, path: str = JOURNAL_SOCKET) -> None:
    """Hand one entry to journald; raises OSError if it cannot be delivered."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        try:
            sock.sendto(data, path)
            return
        except OSError as exc:
            if exc.errno not in (errno.EMSGSIZE, errno.ENOBUFS):
                raise
        # Too big for one datagram: pass a sealed memfd holding the entry.
        fd = os.memfd_create("gpulaunch-record", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.write(fd, data)
            seals = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SEAL
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals)
            rights = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack("i", fd))]
            sock.sendmsg([], rights, 0, path)
        finally:
            os.close(fd)
