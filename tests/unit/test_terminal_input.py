"""The terminal's input for the stdin rank (issue 35 item 3): the relay, the prompt, the option.

The relay runs on a real asyncio loop with real pipes; the prompt is Output's, written to
files standing in for the terminal (tests/unit/test_output.py's way). The whole path, at a
real pty with the watcher, is tests/integration/test_terminal.py.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpulaunch.base.stdin import StdinRelay, others_line, relayable
from gpulaunch.cli import build_parser
from gpulaunch.errors import UsageError
from gpulaunch.logs.output import Output, OutputOptions, Stream
from gpulaunch.model import Cause
from gpulaunch.options import start_options
from gpulaunch.plan.spec import draft_job
from gpulaunch.supervisor.systemd import SystemdSupervisor
from gpulaunch.watcher.loop import Watcher
from tests.unit.fakes import FakeSystemd, Screen, make_job, no_children_left


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    aio = asyncio.new_event_loop()
    yield aio
    aio.close()


def run_until(loop: asyncio.AbstractEventLoop, fd: int, want: bytes) -> bytes:
    """Run the loop until `fd` (a rank's stdin) has given `want`, or its end."""
    got = b""
    done = loop.create_future()

    def readable() -> None:
        nonlocal got
        chunk = os.read(fd, 65536)
        got += chunk
        if not chunk or want in got:
            loop.remove_reader(fd)
            done.set_result(None)

    loop.add_reader(fd, readable)
    loop.run_until_complete(asyncio.wait_for(done, 10))
    return got


def test_what_the_source_gives_reaches_the_rank_and_its_end_ends_it(
    loop: asyncio.AbstractEventLoop,
) -> None:
    source_r, source_w = os.pipe()
    typed: list[bytes] = []
    relay = StdinRelay(source_r, typed.append)
    relay.attach(loop)
    rank = relay.rank_end()
    try:
        os.write(source_w, b"alice\n")
        assert run_until(loop, rank, b"\n") == b"alice\n"
        assert typed == [b"alice\n"]
        os.close(source_w)
        assert run_until(loop, rank, b"never") == b""  # the rank sees the end
        again = relay.rank_end()  # a restarted rank: a pipe's end is for good
        assert os.read(again, 10) == b""
        os.close(again)
    finally:
        relay.close()
        os.close(rank)
        os.close(source_r)


def test_a_rank_that_does_not_read_leaves_the_input_in_the_source(
    loop: asyncio.AbstractEventLoop,
) -> None:
    """The pipe's room bounds what is taken: past it, the rest waits where it was typed."""
    source_r, source_w = os.pipe()
    os.set_blocking(source_w, False)
    relay = StdinRelay(source_r)
    relay.attach(loop)
    rank = relay.rank_end()
    try:
        sent = 0
        with pytest.raises(BlockingIOError):
            while True:  # fill the source, letting the relay run between writes
                sent += os.write(source_w, b"x" * 65536)
                loop.run_until_complete(asyncio.sleep(0))
        loop.run_until_complete(asyncio.sleep(0))
        left = len(os.read(source_r, 1 << 24))  # what the relay did not take
        assert left > 0 and sent - left <= (1 << 20)  # at most a pipe's room (+ one chunk)
    finally:
        relay.close()
        for fd in (rank, source_r, source_w):
            os.close(fd)


def test_a_rank_gone_takes_nothing_more(loop: asyncio.AbstractEventLoop) -> None:
    source_r, source_w = os.pipe()
    relay = StdinRelay(source_r)
    relay.attach(loop)
    os.close(relay.rank_end())  # the rank ended (or closed its stdin)
    try:
        os.write(source_w, b"first\n")
        loop.run_until_complete(asyncio.sleep(0.05))
        os.write(source_w, b"second\n")
        loop.run_until_complete(asyncio.sleep(0.05))
        assert os.read(source_r, 100) == b"second\n"  # left for whoever reads it next
    finally:
        relay.close()
        os.close(source_r)
        os.close(source_w)


def test_what_is_relayed_and_what_is_passed_as_is(tmp_path: object) -> None:
    r, w = os.pipe()
    null = os.open(os.devnull, os.O_RDONLY)
    master, slave = os.openpty()
    try:
        assert relayable(r) and relayable(slave) and not relayable(null)
    finally:
        for fd in (r, w, null, master, slave):
            os.close(fd)


def test_the_line_that_says_who_reads_the_terminal() -> None:
    assert others_line(0, 1) is None
    line = others_line(1, 4)
    assert line is not None and "rank 1 reads the terminal" in line and "/dev/null" in line
    none = others_line(None, 1)
    assert none is not None and "every rank reads /dev/null" in none


@pytest.fixture(autouse=True)
def no_color(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NO_COLOR", "1")


def prompt_output() -> tuple[Output, Screen]:
    out, err = Screen(tty=True), Screen(tty=True)
    output = Output(OutputOptions(), 2, out.term, err.term)
    output.prompt_rank = 0
    return output, out


def test_the_stdin_ranks_prompt_is_shown_before_its_newline() -> None:
    o, out = prompt_output()
    o.data(0, Stream.STDOUT, b"(Pdb) ")
    assert out.read() == b"[0] (Pdb) "
    o.input_seen(b"p x\n")  # the echo of the typed line took the cursor to a new line
    o.data(0, Stream.STDOUT, b"42\n(Pdb) ")
    assert out.read() == b"[0] 42\n[0] (Pdb) "
    o.data(0, Stream.STDOUT, b"more")  # the cursor still ends the prompt: the line goes on
    o.data(0, Stream.STDOUT, b" done\n")
    assert out.read() == b"more done\n"
    assert o.lines(0) == 2


def test_other_output_ends_a_shown_prompt_first() -> None:
    o, out = prompt_output()
    o.data(0, Stream.STDOUT, b"name? ")
    o.data(1, Stream.STDOUT, b"rank 1 says\n")
    o.data(1, Stream.STDOUT, b"partial of another rank")  # only the stdin rank's is shown
    assert out.read() == b"[0] name? \n[1] rank 1 says\n"
    o.eof(0, Stream.STDOUT)
    assert out.read() == b"[0] \n"


def test_off_a_terminal_only_whole_lines_are_shown() -> None:
    out, err = Screen(tty=False), Screen(tty=False)
    o = Output(OutputOptions(), 1, out.term, err.term)
    o.prompt_rank = 0
    o.data(0, Stream.STDOUT, b"(Pdb) ")
    assert out.read() == b""
    o.data(0, Stream.STDOUT, b"p\n")
    assert out.read() == b"[0] (Pdb) p\n"


def parse(*argv: str) -> object:
    args = build_parser().parse_args(["start", *argv, "train.py"])
    return start_options(args).stdin_rank


def test_the_stdin_rank_option() -> None:
    assert parse() == 0
    assert parse("--stdin-rank", "3") == 3
    assert parse("--stdin-rank", "none") is None
    for bad in ("-1", "x", "1.5"):
        with pytest.raises(UsageError, match="--stdin-rank: '.*' is not a rank"):
            parse(f"--stdin-rank={bad}")


def test_a_stdin_rank_the_job_does_not_have_is_refused(tmp_path: os.PathLike[str]) -> None:
    script = os.path.join(tmp_path, "train.py")
    open(script, "w").close()
    args = build_parser().parse_args(["start", "--nproc", "2", "--stdin-rank", "2", script])
    with pytest.raises(UsageError, match="--stdin-rank 2: the job's ranks are 0 to 1"):
        draft_job(start_options(args), dict(os.environ), str(tmp_path))


def test_ctrl_c_reaches_running_ranks_as_sigint_once(
    wakeup: tuple[int, socket.socket], tmp_path: Path
) -> None:
    """The watcher's first SIGINT while the ranks run: each rank's group gets SIGINT (its
    `except KeyboardInterrupt:` runs: it exits 5), not the gang stop's SIGTERM; the job's
    status is 130 and nothing was killed."""
    ready = tmp_path / "ready"
    os.mkfifo(ready)
    code = (
        f"import time\ntry:\n    open({str(ready)!r}, 'w').write('x')\n"
        "    time.sleep(60)\nexcept KeyboardInterrupt:\n    raise SystemExit(5)\n"
    )
    rank = [sys.executable, "-c", code]
    sd = FakeSystemd()
    spec, units = make_job([rank, rank])

    def interrupt_when_running() -> None:
        seen = 0
        while seen < 2:  # each rank writes once; a writer's close may end one open
            with open(ready, "rb") as fifo:
                seen += fifo.read().count(b"x")
        wakeup[1].send(bytes([signal.SIGINT]))

    thread = threading.Thread(target=interrupt_when_running, daemon=True)
    thread.start()
    report = Watcher(spec, SystemdSupervisor(sd, units), wakeup[0], runtime_dir=tmp_path).run()
    thread.join(10)
    assert (report.status, report.cause) == (130, Cause.INTERRUPTED)
    assert [(r.exit.code, r.exit.stopped_by_watcher) for r in report.ranks if r.exit] == [
        (5, True),
        (5, True),
    ]
    assert not any(call[0] == "kill" for call in sd.calls)
    assert no_children_left()
