"""The log pump: one small process per rank, inside the rank's scope.

journald attributes what a stream carries to the process that writes it (its
cgroup, hence its unit; systemd-facts.md). For `journalctl -u <rank scope>` to
show a rank's output while the watcher also gets every line for the live view
and `--log-dir`, something inside the rank's scope must copy the rank's pipes to
both: this pump. It is forked from the watcher (no exec, no imports), held at
the same kind of gate as the rank, and moved into the rank's scope with it.

It ignores SIGTERM/SIGINT/SIGHUP so that it drains the pipes until the rank and
everything holding them are gone (EOF); systemd's SIGKILL after the grace ends it
like any process of the scope.
"""

from __future__ import annotations

import errno
import os
import selectors
import signal
import socket
from dataclasses import dataclass

JOURNAL_STDOUT = "/run/systemd/journal/stdout"
# The pump drains the rank's pipes to the end; a broken watcher pipe is handled.
IGNORED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGPIPE)
CHUNK = 65536

# syslog priorities (sd-daemon.h): stdout as info, stderr as err.
PRIORITY = {"stdout": 6, "stderr": 3}


@dataclass(frozen=True)
class JournalTarget:
    """How the pump's journal streams present themselves (sd_journal_stream_fd(3))."""

    identifier: str  # SYSLOG_IDENTIFIER of every line, e.g. "rank3"
    unit: str  # the rank's unit; journald uses it for lines whose writer is gone (root only)


def journal_reachable() -> str | None:
    """None if journald's stream socket accepts connections, else why not."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.connect(JOURNAL_STDOUT)
    except OSError as exc:
        return f"{JOURNAL_STDOUT}: {exc.strerror}"
    return None


def open_journal_stream(target: JournalTarget, stream: str) -> socket.socket:
    """A stream to journald, the way sd_journal_stream_fd() opens one."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(JOURNAL_STDOUT)
    # identifier, unit id, priority, level prefix, forward to syslog, kmsg, console
    header = f"{target.identifier}\n{target.unit}\n{PRIORITY[stream]}\n0\n0\n0\n0\n"
    sock.sendall(header.encode("utf-8", "surrogateescape"))
    return sock


def _write_all(fd: int, data: bytes) -> bool:
    """Write everything; False once the reader has gone (the watcher died)."""
    view = memoryview(data)
    while view:
        try:
            n = os.write(fd, view)
        except OSError as exc:
            if exc.errno == errno.EPIPE:
                return False
            raise
        view = view[n:]
    return True


def _close_journal(sock: socket.socket) -> None:
    """End a journal stream and wait until journald has read all of it.

    journald closes its end once it has processed a stream's EOF. Staying
    alive until then keeps every line attributed to the rank's unit (a gone
    writer's lines can lose it), and tells the watcher, through this process's
    exit, that the journal holds everything we sent.
    """
    try:
        sock.shutdown(socket.SHUT_WR)
        while sock.recv(1):
            pass
    except OSError:
        pass
    sock.close()


def run_pump(
    inputs: dict[str, int], live: dict[str, int], journal: JournalTarget | None
) -> None:  # pragma: no cover - runs in the forked pump (exercised by integration tests)
    """Copy each input stream to journald and to the watcher until every input is at EOF.

    It is forked with IGNORED_SIGNALS ignored already: a gang stop may reach it
    before this function runs.
    """
    journals: dict[str, socket.socket] = {}
    if journal is not None:
        for stream in inputs:
            try:
                journals[stream] = open_journal_stream(journal, stream)
            except OSError:
                pass  # journald went away since the watcher checked: the live copy goes on
    selector = selectors.DefaultSelector()
    for stream, fd in inputs.items():
        selector.register(fd, selectors.EVENT_READ, stream)
    open_live = dict(live)
    while selector.get_map():
        for key, _ in selector.select():
            stream = key.data
            data = os.read(key.fd, CHUNK)
            if not data:
                selector.unregister(key.fd)
                os.close(key.fd)
                if stream in journals:
                    _close_journal(journals.pop(stream))
                if stream in open_live:
                    os.close(open_live.pop(stream))
                continue
            if stream in journals:
                try:
                    journals[stream].sendall(data)
                except OSError:
                    journals.pop(stream).close()
            if stream in open_live and not _write_all(open_live[stream], data):
                os.close(open_live.pop(stream))
    os._exit(0)
