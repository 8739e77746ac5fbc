"""Owns the terminal: every rank's lines, prefixed, a live progress line, and `--log-dir` files.

The watcher hands each rank's live pipes (copies made by the rank's log pump)
to `Output`, which reads them on the watcher's loop. Lines are never mixed:
each (rank, stream) has its own partial-line buffer and a line is written in
one piece. Carriage-return updates (tqdm) are shown on a terminal as a block of
progress lines at the bottom, one per rank (and stream) drawing a bar, redrawn
in place while the other output scrolls above it; a bar whose line ends leaves
the block and is shown once, in its final state, like any line. Off a terminal
only the final state is shown.

Writing to a slow terminal must not stall the loop: terminal output is queued
and written as the terminal accepts it; reading of the rank pipes pauses only
when a large backlog builds up (the pumps then block, and so the ranks).
"""

from __future__ import annotations

import asyncio
import enum
import os
import re
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Protocol

from gpulaunch.errors import UsageError
from gpulaunch.logs.excerpt import LINE_KEEP, clip_line, excerpt, final_state
from gpulaunch.logs.terminal import BACKLOG_RESUME, Terminal
from gpulaunch.model import LogFileGap
from gpulaunch.numberlist import parse_number_list

CHUNK = 65536
MAX_LINE = 1 << 20  # a longer line without newline is shown in pieces of this size
BACKLOG_PAUSE = 64 << 20  # stop reading rank pipes above this much unwritten terminal output


class LineKeeper(Protocol):
    """Where a detached job's lines go without journald (logs/spool.py `Spool`)."""

    def lines(self, rank: int, stderr: bool, lines: Iterable[bytes]) -> None: ...

    def message(self, text: str) -> None: ...


_COLORS = (36, 33, 35, 32, 34, 31, 96, 93, 95, 92, 94, 91)
_CLEAR_LINE = b"\r\x1b[2K"
_UP_AND_CLEAR = b"\x1b[1A\x1b[2K"
_SGR = re.compile(rb"\x1b\[[0-9;]*m")


class Stream(enum.StrEnum):
    """A rank's output stream."""

    STDOUT = "stdout"
    STDERR = "stderr"


@dataclass(frozen=True)
class OutputOptions:
    """What the user asked to see: `--ranks`, `--quiet`, `--log-dir`."""

    ranks: frozenset[int] | None = None  # None: every rank
    quiet: bool = False
    log_dir: Path | None = None


TAIL_LINES = 20  # stderr lines kept per rank for the failure report
TRACEBACK = b"Traceback (most recent call last):"  # (torch may prefix it: "[rank1]: ")


def journal_entries(text: bytes, lines: list[bytes]) -> int:
    """How many entries journald makes of `lines` (`text` split at newlines).

    journald ends a stream's line at a newline or a NUL and stores no empty one
    (journald-stream.c stdout_stream_scan, stdout_stream_log: `isempty`): an empty line is
    not a line the journal lacks, and "a\0b" is two entries. (Lines over its LineMax=,
    48 KiB, become several entries too: not counted here.) In C unless a NUL is there.
    """
    if b"\0" not in text:
        return len(lines) - lines.count(b"")
    return sum(len(line.split(b"\0")) - line.split(b"\0").count(b"") for line in lines)


@dataclass
class _LineBuffer:
    partial: bytearray = field(default_factory=bytearray)
    lines: int = 0
    entries: int = 0  # what journald makes of them: no empty one, one per NUL-ended piece
    tail: deque[bytes] = field(default_factory=lambda: deque(maxlen=TAIL_LINES))  # clipped
    # A line longer than MAX_LINE is shown in pieces; for the tail, keep its start and
    # the end so far, and count the bytes dropped between them.
    long_start: bytes = b""
    long_end: bytes = b""
    long_dropped: int = 0
    raised_at: float | None = None  # when it last began a Python traceback (stderr)
    shown: int = 0  # bytes of `partial` already on the screen (the stdin rank's prompt)

    def remember(self, lines: list[bytes]) -> None:
        """The last lines of a chunk (the first may end a long line), final and clipped."""
        tail = [clip_line(final_state(line)) for line in lines[-TAIL_LINES:]]
        if self.long_start:
            if len(lines) <= TAIL_LINES and b"\r" not in lines[0].rstrip(b"\r"):
                whole = self.long_start + self.long_end + lines[0]
                tail[0] = clip_line(final_state(whole), self.long_dropped)
            self.long_start, self.long_end, self.long_dropped = b"", b"", 0
        self.tail.extend(tail)

    def piece(self, piece: bytes) -> None:
        """A piece of a line too long to hold, shown on its own."""
        if (cr := piece.rfind(b"\r")) >= 0:  # drawn again from its start: the rest is gone
            self.long_start, self.long_end, self.long_dropped, piece = b"", b"", 0, piece[cr + 1 :]
        if not self.long_start:
            self.long_start, piece = piece[:LINE_KEEP], piece[LINE_KEEP:]
        end = self.long_end + piece
        self.long_end = end[-LINE_KEEP:]
        self.long_dropped += len(end) - len(self.long_end)


class Output:
    """Every rank's output: to the terminal (filtered, prefixed), to `--log-dir`, counted."""

    def __init__(
        self,
        options: OutputOptions,
        world_size: int,
        stdout: Terminal | None = None,
        stderr: Terminal | None = None,
    ) -> None:
        self.options = options
        self.stdout = stdout or Terminal(1)
        self.stderr = stderr or Terminal(2)
        self._width = len(str(max(world_size - 1, 0)))
        self._color = self.stdout.is_tty and "NO_COLOR" not in os.environ
        self._buffers: dict[tuple[int, Stream], _LineBuffer] = {}
        self._pipes: dict[int, tuple[int, Stream]] = {}
        self._files: dict[int, int] = {}
        self._gaps: dict[int, LogFileGap] = {}  # --log-dir files given up on
        self._watch: Callable[[int, Callable[[], None]], None] | None = None
        # The progress block: (rank, stream) -> its bar's current text, and how many
        # lines of it are on the screen (the cursor is at the end of its last line).
        self._bars: dict[tuple[int, Stream], bytes] = {}
        self._drawn = 0
        self._screen = self.stderr if self.stderr.is_tty else self.stdout
        self._loop: asyncio.AbstractEventLoop | None = None
        self._paused = False
        self._on_change: Callable[[], None] = lambda: None
        self._last_line: dict[int, float] = {}  # rank -> time.time() of its last complete line
        self.last_data_at = 0.0  # time.monotonic() of the last output of any rank (--hang-timeout)
        self.spool: LineKeeper | None = None  # a detached job without journald keeps its lines here
        # told of each chunk of complete lines of a rank (its first line: progress/timeline.py)
        self.on_line: Callable[[int], None] | None = None
        # The rank that reads the terminal (watcher/terminal.py): its line so far is shown at
        # once (a prompt waits for input without a newline); `_open`: the stream whose shown
        # line the cursor still ends, until a typed line (its echo) or other output ends it.
        self.prompt_rank: int | None = None
        self._open: tuple[int, Stream] | None = None
        for term in (self.stdout, self.stderr):
            term.on_drained = self._resume
        if options.log_dir is not None:
            try:
                options.log_dir.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise UsageError(
                    f"cannot create --log-dir {options.log_dir}: {exc.strerror}", LOG_DIR_HINT
                ) from None

    def place_node(self, first_rank: int, world_size: int) -> None:
        """Several nodes: this node's ranks start at `first_rank` of `world_size`.

        `--ranks` counts this node's ranks from 0, as torchrun's --local-ranks-filter.
        """
        self._width = len(str(max(world_size - 1, 0)))
        if self.options.ranks is not None:
            shown = frozenset(first_rank + r for r in self.options.ranks)
            self.options = replace(self.options, ranks=shown)

    # -- wiring -------------------------------------------------------------

    def attach(
        self,
        loop: asyncio.AbstractEventLoop,
        on_change: Callable[[], None],
        watch: Callable[[int, Callable[[], None]], None] | None = None,
    ) -> None:
        """Read pipes on `loop`; call `on_change` when a pipe closes (the watcher re-checks).

        `watch(fd, handler)` is the watcher's dispatch: what a handler raises
        reaches the watcher's loop, never asyncio's logger.
        """
        self._loop = loop
        self._on_change = on_change
        self._watch = watch
        self.stdout.attach(loop)
        self.stderr.attach(loop)

    def add_pipe(self, fd: int, rank: int, stream: Stream) -> None:
        """A live pipe of a rank (read end, owned by Output from now on)."""
        os.set_blocking(fd, False)
        self._pipes[fd] = (rank, stream)
        self._buffers.setdefault((rank, stream), _LineBuffer())
        if self.options.log_dir is not None and rank not in self._files and rank not in self._gaps:
            path = self.options.log_dir / f"rank{rank}.log"
            try:
                self._files[rank] = os.open(
                    path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644
                )
            except OSError as exc:
                self._give_up(rank, exc)
        if self._loop is not None and not self._paused:
            self._add_reader(fd)

    def _add_reader(self, fd: int) -> None:
        if self._watch is not None:
            self._watch(fd, lambda: self._read(fd))
        elif self._loop is not None:
            self._loop.add_reader(fd, self._read, fd)

    @property
    def open_pipes(self) -> int:
        return len(self._pipes)

    def lines(self, rank: int) -> int:
        """Lines a rank has written so far, stdout and stderr together."""
        return sum(b.lines for (r, _), b in self._buffers.items() if r == rank)

    def journal_lines(self, rank: int) -> int:
        """The entries journald makes of those lines (`journal_entries`): no empty ones."""
        return sum(b.entries for (r, _), b in self._buffers.items() if r == rank)

    @property
    def log_file_gaps(self) -> tuple[LogFileGap, ...]:
        """The `--log-dir` files that lack some of their rank's lines, and why."""
        return tuple(
            replace(self._gaps[rank], lines_total=self.lines(rank)) for rank in sorted(self._gaps)
        )

    def last_line_at(self, rank: int) -> float | None:
        """When (time.time()) a rank's last complete line arrived, stdout or stderr; None: none yet.

        Published as `LastOutput` on the bus (docs/dbus.md) for `gpulaunch top`.
        """
        return self._last_line.get(rank)

    def raised_at(self, rank: int) -> float | None:
        """When the rank last began to print a Python traceback on stderr (time.monotonic)."""
        buf = self._buffers.get((rank, Stream.STDERR))
        return None if buf is None else buf.raised_at

    def stderr_tail(self, rank: int) -> str:
        """The last lines a rank wrote to stderr (for the report of a failure), bounded."""
        buf = self._buffers.get((rank, Stream.STDERR))
        return "" if buf is None else excerpt(list(buf.tail))

    # -- reading ------------------------------------------------------------

    def _read(self, fd: int) -> None:
        rank, stream = self._pipes[fd]
        try:
            data = os.read(fd, CHUNK)
        except BlockingIOError:
            return
        if data:
            self.data(rank, stream, data)
            return
        if self._loop is not None:
            self._loop.remove_reader(fd)
        os.close(fd)
        del self._pipes[fd]
        self.eof(rank, stream)
        self._on_change()

    def data(self, rank: int, stream: Stream, chunk: bytes) -> None:
        """A chunk of a rank's output, as it came."""
        self.last_data_at = time.monotonic()
        if rank in self._files:
            self._write_file(rank, chunk)
        buf = self._buffers.setdefault((rank, stream), _LineBuffer())
        cut = chunk.rfind(b"\n")
        if cut >= 0 and (rank, stream) in self._bars:
            del self._bars[(rank, stream)]  # its line ended: shown above, in its final state
        if cut >= 0:
            # Every complete line at once: split and join run in C, not per line in Python.
            text = bytes(buf.partial) + chunk[:cut]
            lines = text.split(b"\n")
            buf.partial = bytearray(chunk[cut + 1 :])
            shown, buf.shown = buf.shown, 0
            buf.lines += len(lines)
            buf.entries += journal_entries(text, lines)
            buf.remember(lines)
            if stream is Stream.STDERR and TRACEBACK in chunk:
                buf.raised_at = self.last_data_at
            self._last_line[rank] = time.time()
            if self.on_line is not None:
                self.on_line(rank)
            if self.spool is not None:
                self.spool.lines(rank, stream is Stream.STDERR, lines)
            self._lines(rank, stream, lines, shown)
        else:
            buf.partial += chunk
        while len(buf.partial) > MAX_LINE:
            piece = bytes(buf.partial[:MAX_LINE])
            del buf.partial[:MAX_LINE]
            buf.piece(piece)
            shown, buf.shown = min(buf.shown, MAX_LINE), max(buf.shown - MAX_LINE, 0)
            if self.spool is not None:
                self.spool.lines(rank, stream is Stream.STDERR, [piece])
            self._lines(rank, stream, [piece], shown)
        if b"\r" in buf.partial:
            self._progress(rank, stream, bytes(buf.partial))
        elif buf.partial and rank == self.prompt_rank:
            self._prompt(rank, stream, buf)
        self._maybe_pause()

    def _write_file(self, rank: int, chunk: bytes) -> None:
        view = memoryview(chunk)
        try:
            while view:
                view = view[os.write(self._files[rank], view) :]
        except OSError as exc:  # a full disk, an I/O error: the file ends here
            os.close(self._files.pop(rank))
            self._give_up(rank, exc)

    def _give_up(self, rank: int, exc: OSError) -> None:
        """A --log-dir file cannot be written: say so once; the terminal and journal go on."""
        assert self.options.log_dir is not None
        path = self.options.log_dir / f"rank{rank}.log"
        error = exc.strerror or str(exc)
        if not self._gaps:
            self.message(
                f"gpulaunch: warning: cannot write {path}: {error}; rank output goes on to the "
                "terminal and the journal, and the report says what --log-dir lacks"
            )
        self._gaps[rank] = LogFileGap(rank, str(path), error, self.lines(rank))

    def eof(self, rank: int, stream: Stream) -> None:
        """The stream ended: show a last line that had no newline."""
        buf = self._buffers.setdefault((rank, stream), _LineBuffer())
        self._bars.pop((rank, stream), None)
        if buf.partial:
            buf.lines += 1
            line = bytes(buf.partial)
            buf.entries += journal_entries(line, [line])
            buf.partial.clear()
            buf.remember([line])
            shown, buf.shown = buf.shown, 0
            if self.spool is not None:
                self.spool.lines(rank, stream is Stream.STDERR, [line])
            self._lines(rank, stream, [line], shown)

    # -- showing ------------------------------------------------------------

    def _shown(self, rank: int) -> bool:
        return not self.options.quiet and (self.options.ranks is None or rank in self.options.ranks)

    def _prefix(self, rank: int) -> bytes:
        tag = f"[{rank:>{self._width}}]"
        if self._color:
            tag = f"\x1b[{_COLORS[rank % len(_COLORS)]}m{tag}\x1b[0m"
        return tag.encode() + b" "

    def _terminal(self, stream: Stream) -> Terminal:
        return self.stdout if stream is Stream.STDOUT else self.stderr

    def _lines(self, rank: int, stream: Stream, lines: list[bytes], shown: int = 0) -> None:
        """Complete lines; `shown`: bytes of the first already on the screen (a prompt)."""
        if not self._shown(rank):
            return
        term = self._terminal(stream)
        rest = b""
        if shown:  # the line a prompt began: the cursor may still end it, else a line of its own
            lines[0] = lines[0][shown:]
            if self._open == (rank, stream):
                rest, lines = lines[0] + b"\n", lines[1:]
                self._open = None
        self._end_open()
        if not lines:
            term.write(rest)
            return
        prefix = self._prefix(rank)
        text = (b"\n" + prefix).join(lines)
        if b"\r" in text:
            text = (b"\n" + prefix).join(final_state(line) for line in lines)
        on_screen = term.is_tty and bool(self._drawn or self._bars)
        if on_screen:
            self._erase_bars()
        term.write(rest + prefix + text + b"\n")
        if on_screen:
            self._draw_bars()

    def _prompt(self, rank: int, stream: Stream, buf: _LineBuffer) -> None:
        """The stdin rank's line so far, on the screen now: it may ask for input."""
        term = self._terminal(stream)
        new = bytes(buf.partial[buf.shown :])
        if not new or not term.is_tty or not self._shown(rank):
            return
        if self._open != (rank, stream):
            self._end_open()
            self._erase_bars()
            new = self._prefix(rank) + new
        term.write(new)
        buf.shown = len(buf.partial)
        self._open = (rank, stream)

    def _end_open(self) -> None:
        """Other output comes: the shown part of a line (a prompt) ends where it is."""
        if self._open is not None:
            self._terminal(self._open[1]).write(b"\n")
            self._open = None

    def input_seen(self, data: bytes) -> None:
        """The stdin rank was given `data`: a typed line's echo took the cursor to a new line."""
        if b"\n" in data or b"\r" in data:
            self._open = None

    def _progress(self, rank: int, stream: Stream, partial: bytes) -> None:
        if not self._shown(rank) or not self._terminal(stream).is_tty:
            return  # off a terminal, only the final state of the line is shown
        current = partial.rsplit(b"\r", 1)[-1] or partial.rstrip(b"\r").rsplit(b"\r", 1)[-1]
        self._end_open()
        self._erase_bars()
        self._bars[(rank, stream)] = current
        self._draw_bars()

    def _erase_bars(self) -> None:
        """Take the progress block off the screen; the cursor ends where it began."""
        if self._drawn:
            self._screen.write(_CLEAR_LINE + _UP_AND_CLEAR * (self._drawn - 1))
            self._drawn = 0

    def _draw_bars(self) -> None:
        """One line per bar, by rank, each cut to the terminal's width so that none wraps."""
        if not self._bars:
            return
        try:
            columns = os.get_terminal_size(self._screen.fd).columns
        except OSError:
            columns = 0  # not a real terminal (tests): nothing is cut
        lines = []
        for (rank, _), text in sorted(self._bars.items()):
            prefix = self._prefix(rank)
            if columns:
                room = max(columns - len(_SGR.sub(b"", prefix)) - 1, 0)
                shown = text.decode("utf-8", "replace")[:room].encode()
            else:
                shown = text
            lines.append(prefix + shown)
        self._screen.write(b"\n".join(lines))
        self._drawn = len(lines)

    def message(self, text: str) -> None:
        """A line of gpulaunch's own (warnings, the report) on stderr, between rank lines."""
        if self.spool is not None:
            self.spool.message(text)
        on_screen = self.stderr.is_tty and bool(self._drawn)
        if on_screen:
            self._erase_bars()
        self._end_open()
        self.stderr.write(text.encode() + b"\n")
        if on_screen:
            self._draw_bars()

    # -- backpressure -------------------------------------------------------

    def _backlog(self) -> int:
        return len(self.stdout.pending) + len(self.stderr.pending)

    def _maybe_pause(self) -> None:
        if self._paused or self._loop is None or self._backlog() < BACKLOG_PAUSE:
            return
        self._paused = True
        for fd in self._pipes:
            self._loop.remove_reader(fd)

    def _resume(self) -> None:
        if not self._paused or self._loop is None or self._backlog() >= BACKLOG_RESUME:
            return
        self._paused = False
        for fd in self._pipes:
            self._add_reader(fd)

    # -- the end ------------------------------------------------------------

    def close(self) -> None:
        """Flush everything (blocking) and release pipes, files and terminal copies."""
        for fd in list(self._pipes):
            if self._loop is not None and not self._paused:
                self._loop.remove_reader(fd)
            os.close(fd)
        self._pipes.clear()
        self._end_open()
        self._erase_bars()
        for term in (self.stdout, self.stderr):
            term.drain()
            term.close()
        for fd in self._files.values():
            os.close(fd)
        self._files.clear()


LOG_DIR_HINT = "give a directory you can write to, or one that can be created"


def log_dir_problem(path: Path) -> str | None:
    """Why `--log-dir path` cannot hold the rank logs, or None: checked before anything starts."""
    if os.path.lexists(path) and not path.exists():
        return f"{path} is a symbolic link to nothing"
    existing = path.absolute()
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        return f"{existing} is not a directory"
    if not os.access(existing, os.W_OK | os.X_OK):
        what = "write to" if existing == path.absolute() else f"create {path} in"
        return f"cannot {what} {existing}"
    return None


def parse_ranks(text: str) -> frozenset[int]:
    """`0`, `0,3`, `0-3,8` -> a set of ranks (like torchrun's --local-ranks-filter, plus ranges)."""
    ranks = frozenset(parse_number_list(text, "rank", skip_empty=True))
    if not ranks:
        raise ValueError("no ranks given")
    return ranks
