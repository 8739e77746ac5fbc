"""Output's line handling, with terminals that are plain pipes or files (no loop needed)."""

from __future__ import annotations

import fcntl
import os
import re
import select
import struct
import termios
from pathlib import Path

import pytest

from gpulaunch.logs.output import Output, OutputOptions, Stream, parse_ranks
from gpulaunch.logs.terminal import Terminal
from gpulaunch.logs.width import rank_columns
from tests.unit.fakes import make


def test_lines_are_prefixed_and_never_mixed() -> None:
    o, out, err = make()
    o.data(0, Stream.STDOUT, b"hel")
    o.data(1, Stream.STDOUT, b"world\nsec")
    o.data(0, Stream.STDOUT, b"lo\n")
    o.data(1, Stream.STDERR, b"oops\n")
    o.data(1, Stream.STDOUT, b"ond\n")
    assert out.read() == b"[1] world\n[0] hello\n[1] second\n"
    assert err.read() == b"[1] oops\n"
    assert (o.lines(0), o.lines(1)) == (1, 3)


def test_partial_last_line_is_shown_at_eof() -> None:
    o, out, _ = make()
    o.data(2, Stream.STDOUT, b"no newline")
    assert out.read() == b""
    o.eof(2, Stream.STDOUT)
    assert out.read() == b"[2] no newline\n"
    assert o.lines(2) == 1


def test_prefix_width_follows_world_size() -> None:
    o, out, _ = make(world=12)
    o.data(3, Stream.STDOUT, b"x\n")
    o.data(11, Stream.STDOUT, b"y\n")
    assert out.read() == b"[ 3] x\n[11] y\n"


def test_carriage_returns_off_a_terminal_show_only_the_final_state() -> None:
    o, _, err = make()
    for i in range(100):
        o.data(0, Stream.STDERR, b"\r%3d%%" % i)
    o.data(0, Stream.STDERR, b"\r100%\n")
    assert err.read() == b"[0] 100%\n"


def test_carriage_returns_on_a_terminal_redraw_one_line() -> None:
    o, out, err = make(tty=True)
    o.data(0, Stream.STDERR, b"\r 10%")
    o.data(0, Stream.STDERR, b"\r 20%")
    o.data(1, Stream.STDOUT, b"a line\n")
    o.data(0, Stream.STDERR, b"\r100%\n")
    screen = err.read()
    # drawn, redrawn, cleared for the other rank's line (and drawn again below it),
    # cleared for the final line
    assert screen.count(b"\r\x1b[2K") == 3
    assert screen.endswith(b"100%\n")
    assert b"a line" in out.read()


def test_crlf_line_endings_are_kept_readable() -> None:
    o, out, _ = make()
    o.data(0, Stream.STDOUT, b"windows\r\n")
    assert out.read() == b"[0] windows\n"


def test_rank_filter_quiet_and_log_dir(tmp_path: Path) -> None:
    o, out, _ = make(OutputOptions(ranks=frozenset({1}), log_dir=tmp_path))
    r0, w0 = os.pipe()
    r1, w1 = os.pipe()
    o.add_pipe(r0, 0, Stream.STDOUT)
    o.add_pipe(r1, 1, Stream.STDOUT)
    o.data(0, Stream.STDOUT, b"zero\n")
    o.data(1, Stream.STDOUT, b"one\n")
    assert out.read() == b"[1] one\n"
    o.close()
    os.close(w0)
    os.close(w1)
    assert (tmp_path / "rank0.log").read_bytes() == b"zero\n"
    assert (tmp_path / "rank1.log").read_bytes() == b"one\n"
    q, qout, _ = make(OutputOptions(quiet=True))
    q.data(0, Stream.STDOUT, b"x\n")
    assert qout.read() == b"" and q.lines(0) == 1


def test_a_full_log_dir_warns_once_and_the_terminal_goes_on(tmp_path: Path) -> None:
    """ENOSPC (/dev/full) on --log-dir files: one warning, every line still on the terminal."""
    for rank in (0, 1):
        (tmp_path / f"rank{rank}.log").symlink_to("/dev/full")
    o, out, err = make(OutputOptions(log_dir=tmp_path))
    pipes = [os.pipe() for _ in range(2)]
    for rank, (r, _) in enumerate(pipes):
        o.add_pipe(r, rank, Stream.STDOUT)
    for i in range(3):
        for rank in (0, 1):
            o.data(rank, Stream.STDOUT, b"line %d\n" % i)
    assert out.read().count(b"\n") == 6
    warnings = err.read().decode().splitlines()
    assert len(warnings) == 1 and "No space left on device" in warnings[0]
    assert str(tmp_path / "rank0.log") in warnings[0]
    gaps = o.log_file_gaps
    assert [(g.rank, g.lines_before, g.lines_total) for g in gaps] == [(0, 0, 3), (1, 0, 3)]
    o.close()
    for _, w in pipes:
        os.close(w)


def test_a_huge_line_without_newline_is_shown_in_pieces() -> None:
    o, out, _ = make()
    o.data(0, Stream.STDOUT, b"x" * (3 << 20))
    o.eof(0, Stream.STDOUT)
    shown = out.read()
    assert shown.count(b"[0] ") == 3 and len(shown) == (3 << 20) + 3 * 5


@pytest.mark.parametrize(
    ("text", "ranks"),
    [("0", {0}), ("0,3", {0, 3}), ("0-2,5", {0, 1, 2, 5}), (" 1 , 2 ", {1, 2})],
)
def test_parse_ranks(text: str, ranks: set[int]) -> None:
    assert parse_ranks(text) == frozenset(ranks)


@pytest.mark.parametrize("text", ["", "a", "3-1", "1-x", "-1"])
def test_parse_ranks_errors(text: str) -> None:
    with pytest.raises(ValueError):
        parse_ranks(text)


def test_several_nodes_filter_this_nodes_ranks_counted_from_zero() -> None:
    """--ranks / --local-ranks-filter on node 1 of a 2x2 job: local 1 is global rank 3."""
    out = Output(OutputOptions(ranks=frozenset({1})), 2)
    out.place_node(first_rank=2, world_size=4)
    assert out.options.ranks == frozenset({3})


class Vt:
    """Just enough of a terminal to read what a pty shows: text, CR, LF, and the
    sequences Output uses (erase line, cursor up, colours)."""

    def __init__(self) -> None:
        self.lines: list[str] = [""]
        self.row = 0
        self.col = 0

    def feed(self, data: bytes) -> None:
        text = data.decode()
        i = 0
        while i < len(text):
            ch = text[i]
            if ch == "\x1b":
                m = re.match(r"\x1b\[([0-9;]*)([A-Za-z])", text[i:])
                assert m is not None, repr(text[i : i + 10])
                arg, op = m.groups()
                if op == "A":
                    self.row = max(self.row - int(arg or 1), 0)
                elif op == "K":
                    assert arg == "2"
                    self.lines[self.row] = ""
                else:
                    assert op == "m"
                i += m.end()
                continue
            if ch == "\r":
                self.col = 0
            elif ch == "\n":
                self.row += 1
                if self.row == len(self.lines):
                    self.lines.append("")
            else:
                line = self.lines[self.row].ljust(self.col)
                self.lines[self.row] = line[: self.col] + ch + line[self.col + 1 :]
                self.col += 1
            i += 1

    @property
    def screen(self) -> list[str]:
        return [line for line in self.lines[: self.row + 1] if line]


def test_several_ranks_progress_bars_on_a_pty() -> None:
    """One line per rank drawing a bar, redrawn in place, other output scrolling above."""
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 40, 0, 0))
    term = Terminal(slave)
    vt = Vt()
    o = Output(OutputOptions(), 4, term, term)

    def step(rank: int, stream: Stream, data: bytes) -> list[str]:
        o.data(rank, stream, data)
        while True:
            r, _, _ = select.select([master], [], [], 0)
            if not r:
                return vt.screen
            vt.feed(os.read(master, 65536))

    step(0, Stream.STDERR, b"\rtrain  10%|#")
    step(1, Stream.STDERR, b"\rtrain  10%|#")
    step(0, Stream.STDERR, b"\rtrain  20%|##")
    screen = step(2, Stream.STDOUT, b"epoch 1\n")
    assert screen == ["[2] epoch 1", "[0] train  20%|##", "[1] train  10%|#"]
    screen = step(1, Stream.STDERR, b"\rtrain  30%|###" + b"#" * 60)  # wider than the pty
    assert screen[-1] == ("[1] train  30%|###" + "#" * 60)[:39]
    screen = step(0, Stream.STDERR, b"\rtrain 100%|##########\n")  # rank 0's bar is done
    assert screen == [
        "[2] epoch 1",
        "[0] train 100%|##########",
        ("[1] train  30%|###" + "#" * 60)[:39],
    ]
    o.eof(1, Stream.STDERR)
    o.close()
    os.close(slave)
    os.close(master)


def test_ranks_get_the_terminals_width_less_the_prefix() -> None:
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
    term = Terminal(slave)
    o = Output(OutputOptions(), 12, term, term)  # prefix "[NN] ": 5 columns
    fds = (term.fd, term.fd, 0)
    assert rank_columns({}, fds, 12) == {"COLUMNS": "95"}
    assert rank_columns({"COLUMNS": "200"}, fds, 12) == {"COLUMNS": "195"}  # the user's
    o.close()
    os.close(master)


def test_the_users_columns_off_a_terminal() -> None:
    _, out, err = make()
    assert rank_columns({}, (out.fd, err.fd), 4) == {}  # files: no terminal
    assert rank_columns({"COLUMNS": "80"}, (out.fd, err.fd), 4) == {"COLUMNS": "76"}
    assert rank_columns({"COLUMNS": "80"}, (), 1000) == {"COLUMNS": "74"}  # "[999] "
