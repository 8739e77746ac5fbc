"""One output fd (the watcher's stdout or stderr), written without blocking its loop.

The rank lines `Output` (logs/output.py) shows are queued here and written as the
terminal or pipe accepts them; a hung-up or closed one is never the job's error.
"""

from __future__ import annotations

import asyncio
import os
import stat
from collections.abc import Callable

BACKLOG_RESUME = 16 << 20  # below this much queued, the rank pipes are read again


class Terminal:
    """One output fd (1 or 2), written without blocking the loop where that is possible."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.is_tty = os.isatty(fd)
        self.pending = bytearray()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._writer_on = False
        self.on_drained: Callable[[], None] = lambda: None
        self.out_fd = self._nonblocking_copy(fd)

    @staticmethod
    def _nonblocking_copy(fd: int) -> int:
        """A fresh open file description of the same tty or pipe, in non-blocking mode.

        Setting O_NONBLOCK on fd itself would change it for every process that
        shares it (the shell, the ranks). Regular files never block: keep fd.
        """
        try:
            mode = os.fstat(fd).st_mode
        except OSError:
            return fd
        if not (stat.S_ISCHR(mode) or stat.S_ISFIFO(mode)):
            return fd
        try:
            return os.open(f"/proc/self/fd/{fd}", os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            return fd

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    def write(self, data: bytes) -> None:
        self.pending += data
        self._flush()

    def _flush(self) -> None:
        while self.pending:
            try:
                n = os.write(self.out_fd, self.pending)
            except BlockingIOError:
                break
            except OSError:  # EPIPE: nobody reads it any more; EIO: it hung up
                self.pending.clear()  # nobody can see it: never an error of the job's
                break
            del self.pending[:n]
        if self.pending and not self._writer_on and self._loop is not None:
            self._loop.add_writer(self.out_fd, self._flush)
            self._writer_on = True
        elif not self.pending and self._writer_on and self._loop is not None:
            self._loop.remove_writer(self.out_fd)
            self._writer_on = False
        if len(self.pending) < BACKLOG_RESUME:
            self.on_drained()

    def drain(self) -> None:
        """Write everything still queued, blocking if need be (at the very end)."""
        if self.out_fd != self.fd:
            os.set_blocking(self.out_fd, True)
        self._flush()
        if self._writer_on and self._loop is not None:
            self._loop.remove_writer(self.out_fd)
            self._writer_on = False

    def close(self) -> None:
        if self.out_fd != self.fd:
            os.close(self.out_fd)
            self.out_fd = self.fd
