"""What a log pump hands journald (gpulaunch/logs/feed.py): whole lines, counted, never more
than journald's burst per window or the room left (issue 27, item 1)."""

from __future__ import annotations

import os
from pathlib import Path

from gpulaunch.logs.feed import Admission, JournalLimit, JournalSpace, modulate, page_align
from gpulaunch.logs.journal import journal_limit, journal_space


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


def test_journald_scales_the_burst_by_log2_of_its_free_space() -> None:
    """journald-rate-limit.c burst_modulate: x1 up to 1 MiB, then burst * (log2 - 16) / 4."""
    table = [(0, 1), ((1 << 21) - 1, 1), (16 << 20, 2), (256 << 20, 3), (4 << 30, 4)]
    table += [((1 << 30) + 5, 3.5), (64 << 30, 5), (1 << 40, 6)]
    for available, factor in table:
        assert modulate(10000, available) == int(10000 * factor), available


def test_the_pump_sends_the_burst_journald_applies_not_the_configured_one(tmp_path: Path) -> None:
    """Issue 35 item 2: the pump sent 10,000 lines a window where journald kept 35,000."""
    # keep_free beyond the file system: the storage may use min_use = max_use, 256 MiB
    space = JournalSpace(str(tmp_path), 256 << 20, 256 << 20, 1 << 62)
    assert space.available() == 256 << 20
    clock = Clock()
    gate = Admission(JournalLimit(5, 30.0, space), room=1 << 20, clock=clock)
    assert gate.admit(lines(0, 20), 0) == lines(0, 15)  # 5 x 3
    assert gate.held_back == 5
    # journald's files count as used: 129 MiB of them leave it 127 MiB, log2 26: x2.5
    with (tmp_path / "system.journal").open("wb") as f:
        f.write(b"\1" * (129 << 20))
    assert space.available() == 127 << 20
    clock.now += 40.0
    assert gate.admit(lines(20, 20), 0) == lines(20, 12)  # 5 * 10 // 4


def test_journal_space_follows_journald_storage_and_metrics(tmp_path: Path) -> None:
    """Where journald stores (determine_space) and its default limits (journal_default_metrics),
    against what journald itself reported in the box (AVAILABLE=1255411712 of a 12637986816-byte
    tmpfs: max_use 10 %, keep_free 5 %)."""
    assert journal_space(tmp_path) is None  # no machine id
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc/machine-id").write_text("abc\n")
    runtime = tmp_path / "run/log/journal/abc"
    runtime.mkdir(parents=True)
    system = tmp_path / "var/log/journal/abc"
    system.mkdir(parents=True)
    st = os.statvfs(tmp_path)
    size = st.f_frsize * st.f_blocks
    space = journal_space(tmp_path)
    assert space is not None and space.path == str(runtime)  # not flushed to /var yet
    assert space.max_use == min(max(page_align(size // 10), 1 << 20), 4 << 30)
    assert space.keep_free == min(page_align(size // 20), 4 << 30)
    (tmp_path / "run/systemd/journal").mkdir(parents=True)
    (tmp_path / "run/systemd/journal/flushed").touch()
    space = journal_space(tmp_path)
    assert space is not None and space.path == str(system)
    conf = tmp_path / "etc/systemd/journald.conf"
    conf.parent.mkdir(parents=True)
    conf.write_text("[Journal]\nStorage=volatile\nRuntimeMaxUse=64M\nRuntimeKeepFree=1K\n")
    space = journal_space(tmp_path)
    assert space is not None and space.path == str(runtime)
    assert (space.max_use, space.keep_free) == (64 << 20, 1024)
    conf.write_text("[Journal]\nStorage=none\n")
    assert journal_space(tmp_path) is None
    box = 12637986816  # the box's tmpfs: journald said max 1263800320, keep free 631902208
    assert (page_align(box // 10), page_align(box // 20)) == (1263800320, 631902208)
    assert modulate(10000, 1255411712) == 35000
