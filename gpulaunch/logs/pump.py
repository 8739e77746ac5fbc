"""The log pump: one small process per rank, inside the rank's scope.

journald attributes what a stream carries to the process that writes it (its
cgroup, hence its unit; docs/systemd-facts.md). For `journalctl -u <rank scope>` to
show a rank's output while the watcher also gets every line for the live view
and `--log-dir`, something inside the rank's scope must copy the rank's pipes to
both: this pump. It is forked from the watcher (no exec, no imports), held at
the same kind of gate as the rank, and moved into the rank's scope with it.

It ignores SIGTERM/SIGINT/SIGHUP so that it drains the pipes until the rank and
everything holding them are gone (EOF); systemd's SIGKILL after the grace ends it
like any process of the scope.

When journald goes away (`systemctl stop systemd-journald`, a restart), the pump
connects again at once (journald's sockets stay with systemd, which starts it
again on the next connection), else when the rank writes more. What the rank
wrote meanwhile reaches the terminal only; the pump then exits with
JOURNAL_MISSED, and the watcher counts what the journal lacks for the report.

The rank never waits on journald (logs/feed.py): the pump sends each stream at most
journald's rate-limit burst per interval, holds at most JOURNAL_BACKLOG bytes journald
has not read yet, and leaves out whole lines beyond (JOURNAL_CROWDED when it had to for
lack of room); the terminal and `--log-dir` get every line first.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import selectors
import signal
import socket
import struct
import termios
import time
from dataclasses import dataclass

import setproctitle  # imported by the watcher: the forked pump imports nothing

from gpulaunch.logs.feed import Admission, JournalLimit

JOURNAL_STDOUT = "/run/systemd/journal/stdout"
JOURNAL_BACKLOG = 16 << 20  # bytes a pump holds for journald; lines beyond are left out
JOURNAL_DRAIN_TIMEOUT = 60.0  # at most this long for journald to read a finished stream
# The pump drains the rank's pipes to the end; a broken watcher pipe is handled.
# A notice to a whole rank (SIGUSR1/2, --signal-whole-rank) is not for the pump either.
IGNORED_SIGNALS = (
    signal.SIGTERM,
    signal.SIGINT,
    signal.SIGHUP,
    signal.SIGPIPE,
    signal.SIGUSR1,
    signal.SIGUSR2,
)
CHUNK = 65536
# The pump's exit status: 0, or that journald missed lines (it was away for a while),
# that the pump left lines out for lack of room (journald slower than the rank), or both.
JOURNAL_MISSED = 3
JOURNAL_CROWDED = 4
JOURNAL_MISSED_AND_CROWDED = 5


def journal_status(code: int | None) -> tuple[bool, bool]:
    """(missed, crowded) from a pump's exit status."""
    return (
        code in (JOURNAL_MISSED, JOURNAL_MISSED_AND_CROWDED),
        code in (JOURNAL_CROWDED, JOURNAL_MISSED_AND_CROWDED),
    )


# syslog priorities (sd-daemon.h): stdout as info, stderr as err.
PRIORITY = {"stdout": 6, "stderr": 3}


@dataclass(frozen=True)
class JournalTarget:
    """How the pump's journal streams present themselves (sd_journal_stream_fd(3))."""

    identifier: str  # SYSLOG_IDENTIFIER of every line, e.g. "rank3"
    unit: str  # the rank's unit; journald uses it for lines whose writer is gone (root only)
    limit: JournalLimit = JournalLimit()  # journald's rate limit: no more is sent (feed.py)


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


def _unread(sock: socket.socket) -> int:
    """Bytes we sent that journald has not read yet (SIOCOUTQ, unix(7))."""
    try:
        raw = fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0\0\0\0")
    except OSError:
        return 0
    value: int = struct.unpack("i", raw)[0]
    return value


def _close_journal(sock: socket.socket) -> None:
    """Close a journal stream once journald has read all of it (bounded wait).

    journald attributes a line to the unit of the process that wrote it, looked
    up when it reads the line: a writer already gone can lose its unit. It
    sends no acknowledgement and shuts its side of the stream at once, so the
    socket's unread-bytes count is the only sign that it caught up: checked
    every few milliseconds, only here, at the end of the pump's life.
    """
    deadline = time.monotonic() + JOURNAL_DRAIN_TIMEOUT
    while _unread(sock) > 0 and time.monotonic() < deadline:
        time.sleep(0.005)
    sock.close()


class _JournalStream:
    """One stream to journald with a backlog, written as journald accepts it.

    The backlog keeps the rank from waiting on journald, which parses every
    line and is slower than a rank printing in a tight loop.
    """

    def __init__(self, sock: socket.socket) -> None:
        sock.setblocking(False)
        self.sock = sock
        self.backlog = bytearray()
        self.sent = 0  # bytes of the backlog already written

    @property
    def pending(self) -> int:
        return len(self.backlog) - self.sent

    def flush(self) -> bool:
        """Write what journald takes now; False once journald is gone (`pending` kept)."""
        while self.pending:
            try:
                self.sent += self.sock.send(memoryview(self.backlog)[self.sent :])
            except BlockingIOError:
                break
            except OSError:
                return False
        if self.sent and self.sent * 2 >= len(self.backlog):
            del self.backlog[: self.sent]  # compact now and then, not on every send
            self.sent = 0
        return True


def pump_titles(rank: int) -> tuple[str, str]:
    """What `ps`/`systemctl status` show for rank's pump (its argv) and `ps -o comm` (15 bytes)."""
    return f"gpulaunch: log pump, rank {rank}", f"glpump-rank{rank}"[:15]


def name_process(rank: int) -> None:  # pragma: no cover - runs in the forked pump
    """Show the pump as what it is, not as a copy of the watcher's `gpulaunch start ...`."""
    title, comm = pump_titles(rank)
    setproctitle.setproctitle(title)  # rewrites argv in place (/proc/PID/cmdline)
    setproctitle.setthreadtitle(comm)  # prctl(PR_SET_NAME): /proc/PID/comm


def run_pump(
    inputs: dict[str, int],
    live: dict[str, int],
    journal: JournalTarget | None,
    rank: int | None = None,
    hold: int | None = None,
) -> None:  # pragma: no cover - runs in the forked pump (exercised by integration tests)
    """Copy each input stream to journald and to the watcher until every input is at EOF.

    `hold`: a pipe the watcher holds the other end of; at the end the pump waits for its
    EOF before exiting, so that the rank's scope (and its cgroup, with `memory.peak`,
    `memory.events` and `cpu.stat`) stays until the watcher has read them: a scope
    without processes is removed at once (watcher/final.py).

    It is forked with IGNORED_SIGNALS ignored already: a gang stop may reach it
    before this function runs. Up to JOURNAL_BACKLOG bytes wait for journald
    in memory; lines beyond are left out of the journal (never out of `live`).
    """
    if rank is not None:
        name_process(rank)
    journals: dict[str, _JournalStream] = {}
    missed = False  # journald may lack some lines: the exit status says so
    gates = {
        stream: Admission(journal.limit if journal else JournalLimit(), JOURNAL_BACKLOG)
        for stream in inputs
    }

    def connect(stream: str, backlog: bytes = b"") -> None:
        """A (new) journal stream; without journald, the lines go to the live copy only."""
        nonlocal missed
        assert journal is not None
        try:
            journals[stream] = _JournalStream(open_journal_stream(journal, stream))
        except OSError:
            missed = True  # retried when the rank writes more
            return
        journals[stream].backlog += backlog

    if journal is not None:
        for stream in inputs:
            connect(stream)
    selector = selectors.DefaultSelector()
    reading = dict(inputs)
    open_live = dict(live)
    writing: set[str] = set()  # journal streams waiting for journald to accept more

    def watch_journal(stream: str) -> None:
        js = journals[stream]
        if js.pending and stream not in writing:
            selector.register(js.sock, selectors.EVENT_WRITE, ("journal", stream))
            writing.add(stream)
        elif not js.pending and stream in writing:
            selector.unregister(js.sock)
            writing.discard(stream)

    def flush(stream: str) -> None:
        nonlocal missed
        if not journals[stream].flush():
            # journald went away: what it had not read yet of this stream is lost
            missed = True
            js = journals.pop(stream)
            if stream in writing:
                selector.unregister(js.sock)
                writing.discard(stream)
            js.sock.close()
            connect(stream, bytes(js.backlog[js.sent :]))
            if stream not in journals:
                return
            if not journals[stream].flush():  # gone again: wait for the rank's next lines
                journals.pop(stream).sock.close()
                return
        watch_journal(stream)

    for stream, fd in reading.items():
        selector.register(fd, selectors.EVENT_READ, ("in", stream))
    while reading or any(js.pending for js in journals.values()):
        for key, _ in selector.select():
            kind, stream = key.data
            if kind == "journal":
                if stream in journals:
                    flush(stream)
                continue
            data = os.read(key.fd, CHUNK)
            if not data:
                selector.unregister(key.fd)
                os.close(key.fd)
                del reading[stream]
                if stream in journals and not gates[stream].ends_line:
                    # journald would store a last line without newline only at EOF;
                    # ending it here lets "all bytes read" mean "all lines stored".
                    journals[stream].backlog += b"\n"
                    flush(stream)
                if stream in open_live:
                    os.close(open_live.pop(stream))
                continue
            if stream in open_live and not _write_all(open_live[stream], data):
                os.close(open_live.pop(stream))
            if journal is not None and stream not in journals:
                connect(stream)  # journald was away: back now?
            if stream in journals:
                sent = gates[stream].admit(data, sum(js.pending for js in journals.values()))
                if sent:
                    journals[stream].backlog += sent
                    flush(stream)
    for js in journals.values():
        js.sock.setblocking(True)
        _close_journal(js.sock)
    if hold is not None:
        with contextlib.suppress(OSError):
            os.read(hold, 1)  # EOF: the watcher has read the rank's cgroup (or is gone)
    crowded = any(gate.crowded for gate in gates.values())
    if missed:
        os._exit(JOURNAL_MISSED_AND_CROWDED if crowded else JOURNAL_MISSED)
    os._exit(JOURNAL_CROWDED if crowded else 0)
