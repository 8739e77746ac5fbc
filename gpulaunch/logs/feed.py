"""Which of a rank's lines its log pump hands journald: never at the cost of the rank's pace.

journald parses and stores every line it receives, one at a time, and is slower than a
rank printing in a tight loop; and of a unit's lines it keeps at most `RateLimitBurst=`
per `RateLimitIntervalSec=` and priority (stdout and stderr count apart), after parsing
the rest too. The pump therefore:

- sends a stream at most the burst per interval that journald applies: the configured
  burst scaled, as journald scales it, by the space its storage has left (`modulate`,
  from `JournalSpace.available`, read again at each window), so that journald keeps every
  line the pump sends and does not spend a CPU on lines it would throw away;
- holds at most `room` bytes that journald has not taken yet; lines beyond are not sent
  (the rank never waits on journald);
- drops whole lines only, and counts them: the terminal and `--log-dir` get every line
  regardless (the pump writes them first), and the report says exactly how many of each
  rank's lines the journal lacks (logs/journal.py counts what it stored).

Imports nothing of gpulaunch (the forked pump runs it); `journal_limit` in
logs/journal.py reads the limit and the storage's size limits from journald.conf, in the
watcher.
"""

from __future__ import annotations

import enum
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

# journald starts its window when it reads a line, later than the pump sent it: the pump's
# window is this much longer, so that it never sends a new burst into journald's old window.
WINDOW_MARGIN = 1.1
WINDOW_SLACK_S = 1.0


PAGE = 4096


def page_align(n: int) -> int:
    """journald's PAGE_ALIGN (sizes of its storage are whole pages)."""
    return (n + PAGE - 1) // PAGE * PAGE


def modulate(burst: int, available: int) -> int:
    """The burst journald applies, given the bytes its storage may still use.

    journald-rate-limit.c `burst_modulate` (systemd 252): k = log2(available), rounded down;
    up to 1 MiB (k <= 20) the configured burst, else burst * (k - 16) / 4: x2 at 16 MiB,
    x3 at 256 MiB, x4 at 4 GiB, x5 at 64 GiB.
    """
    k = max(available, 1).bit_length() - 1
    return burst if k <= 20 else burst * (k - 16) // 4


@dataclass(frozen=True)
class JournalSpace:
    """Where journald stores entries now and its size limits there (journald.conf(5)).

    `path`: its machine-id directory (/var/log/journal/ID once flushed to persistent
    storage, else /run/log/journal/ID); the limits as journald fixes them at start
    (journal-file.c `journal_default_metrics`).
    """

    path: str
    max_use: int
    min_use: int
    keep_free: int

    def available(self) -> int | None:
        """Bytes journald may still use, as journald-server.c `cache_space_refresh` has it:
        the file system's available bytes less `keep_free`, plus its files' blocks, clamped
        to [min_use, max_use], less its files' blocks. None: the directory is gone."""
        try:
            st = os.statvfs(self.path)
            used = 0
            with os.scandir(self.path) as entries:
                for entry in entries:
                    if entry.name.endswith((".journal", ".journal~")) and entry.is_file(
                        follow_symlinks=False
                    ):
                        used += entry.stat(follow_symlinks=False).st_blocks * 512
        except OSError:
            return None
        free = max(st.f_bsize * st.f_bavail - self.keep_free, 0)
        limit = min(max(used + free, self.min_use), self.max_use)
        return max(limit - used, 0)


@dataclass(frozen=True)
class JournalLimit:
    """journald's rate limit per unit and priority; burst None: no limit.

    `burst` is the configured `RateLimitBurst=`; `space`, where known, is what journald
    scales it by (`burst_now`).
    """

    burst: int | None = None
    interval_s: float = 30.0
    space: JournalSpace | None = None

    def burst_now(self) -> int | None:
        """The burst journald applies now: the configured one scaled by its free space."""
        if self.burst is None or self.space is None:
            return self.burst
        available = self.space.available()
        return self.burst if available is None else modulate(self.burst, available)


class _Partial(enum.Enum):
    NONE = "none"  # the stream so far ends a line
    SENDING = "sending"  # inside a line that goes to journald: its rest goes too
    SKIPPING = "skipping"  # inside a line held back: its rest is held back too


class Admission:
    """One stream's gate to journald: `admit` each chunk the rank wrote, send what it returns."""

    def __init__(
        self, limit: JournalLimit, room: int, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.limit = limit
        self.room = room
        self.clock = clock
        self.allowed = 0  # lines the current window still takes
        self.window_end = float("-inf")
        self.partial = _Partial.NONE
        self.held_back = 0  # lines not handed to journald, in all
        self.crowded = False  # some of them for lack of room (journald slower than the rank)

    @property
    def ends_line(self) -> bool:
        """Whether what was sent ends with a whole line (else: add a newline at EOF)."""
        return self.partial is not _Partial.SENDING

    def admit(self, data: bytes, pending: int) -> bytes:
        """The part of `data` to send journald, given `pending` bytes it has not taken yet."""
        head = b""
        if self.partial is not _Partial.NONE:
            nl = data.find(b"\n")
            if nl < 0:
                return data if self.partial is _Partial.SENDING else b""
            if self.partial is _Partial.SENDING:
                head = data[: nl + 1]
            data = data[nl + 1 :]
            self.partial = _Partial.NONE
        if not data:
            return head
        lines = data.count(b"\n") + (0 if data.endswith(b"\n") else 1)  # lines begun in data
        take = lines
        if self.limit.burst is not None:
            now = self.clock()
            if now >= self.window_end:
                self.window_end = now + self.limit.interval_s * WINDOW_MARGIN + WINDOW_SLACK_S
                self.allowed = self.limit.burst_now() or 0
            take = min(take, self.allowed)
        free = self.room - pending - len(head)
        if len(data) > free:
            fit = data.count(b"\n", 0, max(free, 0))  # whole lines that fit
            if fit < take:
                take = fit
                self.crowded = True
        if self.limit.burst is not None:
            self.allowed -= take
        if take == lines:
            if not data.endswith(b"\n"):
                self.partial = _Partial.SENDING
            return head + data
        end = 0
        for _ in range(take):
            end = data.index(b"\n", end) + 1
        self.held_back += lines - take
        if not data.endswith(b"\n"):
            self.partial = _Partial.SKIPPING
        return head + data[:end]
