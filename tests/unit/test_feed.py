"""What a log pump hands journald (gpulaunch/logs/feed.py): whole lines, counted, never more
than journald's burst per window or the room left (issue 27, item 1)."""

from __future__ import annotations

from pathlib import Path

from gpulaunch.logs.feed import Admission, JournalLimit
from gpulaunch.logs.journal import journal_limit


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def lines(first: int, n: int) -> bytes:
    return b"".join(b"line %d\n" % i for i in range(first, first + n))


def test_no_limit_and_room_sends_everything_as_it_came() -> None:
    gate = Admission(JournalLimit(None), room=1 << 20)
    assert gate.admit(b"a\nb", 0) == b"a\nb"
    assert not gate.ends_line
    assert gate.admit(b"c\nd\n", 0) == b"c\nd\n"
    assert gate.ends_line and gate.held_back == 0 and not gate.crowded


def test_burst_per_window_then_whole_lines_held_back_and_counted() -> None:
    clock = Clock()
    gate = Admission(JournalLimit(5, 30.0), room=1 << 20, clock=clock)
    assert gate.admit(lines(0, 3), 0) == lines(0, 3)
    # two more fit the burst; the rest of the chunk, with a line begun, is held back
    assert gate.admit(lines(3, 4) + b"partial", 0) == lines(3, 2)
    assert gate.held_back == 3  # lines 5, 6 and the partial one
    assert gate.admit(b" line ends\n" + lines(7, 1), 0) == b""  # its rest too
    assert gate.held_back == 4
    assert not gate.crowded  # the rate limit, not the room
    clock.now += 30.0  # journald's window is over, but the pump waits a little longer
    assert gate.admit(lines(8, 1), 0) == b""
    clock.now += 5.0
    assert gate.admit(lines(9, 2), 0) == lines(9, 2)
    assert gate.held_back == 5


def test_a_line_begun_in_the_window_is_sent_whole() -> None:
    clock = Clock()
    gate = Admission(JournalLimit(1, 30.0), room=1 << 20, clock=clock)
    assert gate.admit(b"start of", 0) == b"start of"
    assert gate.admit(b" the line\nnext\n", 0) == b" the line\n"
    assert gate.held_back == 1 and gate.ends_line


def test_no_room_leaves_out_whole_lines_and_says_crowded() -> None:
    gate = Admission(JournalLimit(None), room=20)
    data = b"0123456789\n0123456789\n"  # 22 bytes: one line fits
    assert gate.admit(data, 0) == b"0123456789\n"
    assert gate.crowded and gate.held_back == 1
    assert gate.admit(b"x\n", 20) == b""  # journald has not read anything yet
    assert gate.held_back == 2
    assert gate.admit(b"y\n", 0) == b"y\n"  # it has caught up


def test_limit_from_journald_conf(tmp_path: Path) -> None:
    conf = tmp_path / "etc/systemd/journald.conf"
    conf.parent.mkdir(parents=True)
    assert journal_limit(tmp_path) == JournalLimit(10000, 30.0)
    journal_limit.cache_clear()
    conf.write_text("[Journal]\nRateLimitBurst=500\nRateLimitIntervalSec=1min\n")
    assert journal_limit(tmp_path) == JournalLimit(500, 60.0)
    journal_limit.cache_clear()
    conf.write_text("[Journal]\nRateLimitIntervalSec=soon\n")  # journald keeps its default
    assert journal_limit(tmp_path) == JournalLimit(10000, 30.0)
    journal_limit.cache_clear()
    conf.write_text("[Journal]\nRateLimitIntervalSec=0\n")
    assert journal_limit(tmp_path) == JournalLimit(None)
    journal_limit.cache_clear()
