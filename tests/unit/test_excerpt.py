"""The bounded error excerpt: stderr tails and @record tracebacks (issue 13, item 12)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpulaunch.logs.excerpt import EXCERPT_MAX, LINE_KEEP, clip_line, excerpt, text_excerpt
from gpulaunch.logs.output import MAX_LINE, Output, OutputOptions, Stream
from gpulaunch.watcher.errorfile import read_error_file
from tests.unit.fakes import make

# Bound of one excerpt: its lines clipped, the notes of what was cut included.
BOUND = EXCERPT_MAX + 200


@pytest.mark.parametrize(
    ("line", "missing", "clipped"),
    [
        (b"short", 0, b"short"),
        (b"x" * 2 * LINE_KEEP, 0, b"x" * 2 * LINE_KEEP),
        (b"a" * LINE_KEEP + b"b" * 10 + b"c" * LINE_KEEP, 0,
         b"a" * LINE_KEEP + b" [... 10 bytes cut ...] " + b"c" * LINE_KEEP),
        (b"a" * LINE_KEEP + b"c" * 5, 1000, b"a" * LINE_KEEP + b" [... 1000 bytes cut ...] ccccc"),
        (b"abc", 7, b"abc [... 7 bytes cut ...] "),
    ],
)  # fmt: skip
def test_clip_line(line: bytes, missing: int, clipped: bytes) -> None:
    assert clip_line(line, missing) == clipped


def test_clip_line_never_splits_a_character() -> None:
    text = clip_line(("ü" * 1000).encode()).decode("utf-8")  # strict: no broken sequence
    assert text.startswith("ü" * (LINE_KEEP // 2)) and text.endswith("ü" * (LINE_KEEP // 2))
    assert "[... 1488 bytes cut ...]" in text


@pytest.mark.parametrize(
    ("lines", "expected"),
    [
        ([], ""),
        ([b"one", b"two"], "one\ntwo"),
        ([b"bad \xff byte"], "bad \ufffd byte"),
    ],
)
def test_excerpt_of_small_input_is_unchanged(lines: list[bytes], expected: str) -> None:
    assert excerpt(lines) == expected


def test_excerpt_keeps_the_last_lines_and_says_how_many_it_cut() -> None:
    lines = [f"line {i}".encode() + b"." * 90 for i in range(1000)]
    text = excerpt([clip_line(line) for line in lines])
    assert len(text.encode()) <= BOUND
    first, *rest = text.split("\n")
    assert first == f"[... {1000 - len(rest)} earlier lines cut ...]"
    assert rest[-1].startswith("line 999.")


def test_text_excerpt_of_a_huge_traceback() -> None:
    text = text_excerpt("Traceback:\n" + "x" * (20 << 20) + "\nRuntimeError: boom")
    assert len(text.encode()) <= BOUND
    assert text.endswith("RuntimeError: boom")
    assert f"[... {(20 << 20) - 2 * LINE_KEEP} bytes cut ...]" in text


def test_stderr_tail_of_20_mib_without_newline() -> None:
    o, _, _ = make(OutputOptions(quiet=True))
    chunk = b"y" * 65536
    o.data(0, Stream.STDERR, b"start")
    for _ in range((20 << 20) // len(chunk)):
        o.data(0, Stream.STDERR, chunk)
    o.data(0, Stream.STDERR, b"end")
    o.eof(0, Stream.STDERR)
    tail = o.stderr_tail(0)
    assert len(tail.encode()) <= BOUND
    assert tail.startswith("start" + "y" * (LINE_KEEP - 5) + " [... ")
    assert tail.endswith("y" * (LINE_KEEP - 3) + "end")
    assert f"[... {(20 << 20) + 8 - 2 * LINE_KEEP} bytes cut ...]" in tail


def test_stderr_tail_of_a_long_line_that_ends() -> None:
    o, _, _ = make(OutputOptions(quiet=True))
    o.data(1, Stream.STDERR, b"a" * (3 * MAX_LINE + 7))
    o.data(1, Stream.STDERR, b"z\nlast line\n")
    lines = o.stderr_tail(1).split("\n")
    cut = 3 * MAX_LINE + 8 - 2 * LINE_KEEP
    end = "a" * (LINE_KEEP - 1) + "z"
    assert lines[0] == "a" * LINE_KEEP + f" [... {cut} bytes cut ...] " + end
    assert lines[1:] == ["last line"]


def test_stderr_tail_memory_is_bounded() -> None:
    o: Output
    o, _, _ = make(OutputOptions(quiet=True))
    for _ in range(40):
        o.data(0, Stream.STDERR, b"q" * (MAX_LINE - 1) + b"\n")
    held = sum(len(line) for line in o._buffers[(0, Stream.STDERR)].tail)
    assert held <= 40 * (2 * LINE_KEEP + 40)


def test_error_file_is_bounded(tmp_path: Path) -> None:
    path = tmp_path / "error.json"
    stack = "Traceback (most recent call last):\n" + "  frame\n" * 5000 + "E" * (1 << 20)
    message = {"message": "boom", "extraInfo": {"py_callstack": stack}}
    path.write_text(json.dumps({"message": message}))
    text = read_error_file(path)
    assert text is not None and len(text.encode()) <= BOUND
    assert text.startswith("[... ") and "earlier lines cut" in text.split("\n")[0]
    assert text.endswith("E" * LINE_KEEP)


def test_error_file_with_lone_surrogates(tmp_path: Path) -> None:
    path = tmp_path / "error.json"
    path.write_text('{"message": "bad \\ud800 surrogate"}')
    assert read_error_file(path) == "bad ? surrogate"


def tqdm_epoch(epoch: int, steps: int = 50) -> list[bytes]:
    """What tqdm writes for one epoch's bar (leave=True): a redraw per step, then a newline."""
    bar = [b"\rEpoch %d: %3d%%|%-10s| %d/%d" % (epoch, s * 2, b"#" * (s // 5), s, steps)
           for s in range(steps + 1)]  # fmt: skip
    return [*bar, b"\n"]


def test_a_progress_bar_is_kept_in_its_final_state_only() -> None:
    """Issue 22, item 16: tqdm's redraws filled the excerpt (20 of 27 lines) and the report."""
    o, _, _ = make()
    for epoch in range(3):
        for chunk in tqdm_epoch(epoch):
            o.data(0, Stream.STDERR, chunk)
    o.data(0, Stream.STDERR, b"\rEpoch 3:  40%|####      | 20/50")  # the bar the failure cut
    o.data(0, Stream.STDERR, b"Traceback (most recent call last):\nValueError: boom\n")
    tail = o.stderr_tail(0)
    assert "\r" not in tail
    assert tail.split("\n") == [
        "Epoch 0: 100%|##########| 50/50",
        "Epoch 1: 100%|##########| 50/50",
        "Epoch 2: 100%|##########| 50/50",
        "Epoch 3:  40%|####      | 20/50Traceback (most recent call last):",
        "ValueError: boom",
    ]


def test_a_huge_progress_line_keeps_its_last_drawing() -> None:
    """A bar redrawn in one line longer than MAX_LINE: the excerpt keeps its last drawing."""
    o, _, _ = make()
    o.data(0, Stream.STDERR, b"\rstep" * (MAX_LINE // 4))  # pieces of a line being redrawn
    o.data(0, Stream.STDERR, b"\rdone: 100%\nboom\n")
    assert o.stderr_tail(0) == "done: 100%\nboom"


def test_a_traceback_file_with_carriage_returns() -> None:
    assert text_excerpt("a\r\nb 10%\rb 100%\nc") == "a\nb 100%\nc"
