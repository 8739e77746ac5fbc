"""The terminal's input for one rank (`--stdin-rank`), copied through a pipe by the process
that owns the terminal.

Every rank is a process group of its own (base/procs.py: a gang stop, containment by
process groups); one that read the terminal itself would be stopped by SIGTTIN, since it
is not the terminal's foreground group, and nothing would say so. So the process that is
in the foreground group reads the terminal and writes what it reads into a pipe, the
rank's stdin: the watcher, or an ordinary user's front end (the watcher then is a service
of the user manager, in no session of the terminal's: it may not make any group the
foreground, and reading the terminal itself would take input from the shell while the job
runs in the background). The front end's pipe is then the watcher's stdin, which the
watcher passes on the same way. Under the direct supervisor's keeper the watcher is a
process group of its own too (the keeper is the shell's job): a small reader process
joins the keeper's group and does the front end's part (`fork_reader`). A terminal's
Ctrl-C stays the watcher's (or the front end's, or the keeper's), which passes it on as
SIGINT to every rank once (watcher/terminal.py).

The terminal's line discipline still echoes and edits a line (canonical mode); a line is
passed on when it is typed in full (Enter). ^D ends the rank's input, as a pipe ends:
for good (a restarted rank gets a new pipe). Job control stays the shell's: SIGTTIN is
ignored while relaying, so a read in a background job fails with EIO instead of stopping
the process; the relay then reads again when the terminal has new input (edge-triggered:
once per line typed, to learn whether a shell's `fg` made the job the foreground, which
sends no SIGCONT to a job that runs) or at SIGCONT. Input waits in the
terminal while the pipe is full (the rank does not read it): the pipe's room is the bound.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import select
import signal
import stat
from collections.abc import Callable

from gpulaunch.linux import set_parent_death_signal

CHUNK = 4096


def relayable(fd: int) -> bool:
    """Whether `fd` is read through a relay (a terminal, a pipe, a socket), not passed as is
    (a file, /dev/null: nothing to wait for, no job control)."""
    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        return False
    return os.isatty(fd) or stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)


def others_line(stdin_rank: int | None, world_size: int) -> str | None:
    """The one line a terminal's user is told when some ranks do not read it."""
    if world_size < 2 and stdin_rank is not None:
        return None
    if stdin_rank is None:
        return "gpulaunch: every rank reads /dev/null, not the terminal (--stdin-rank none)"
    return (
        f"gpulaunch: rank {stdin_rank} reads the terminal; the other ranks read /dev/null "
        "(--stdin-rank N chooses another)"
    )


class StdinRelay:
    """Copies what `source` gives (the terminal, or a pipe) into the current rank's pipe."""

    def __init__(self, source: int, on_input: Callable[[bytes], None] = lambda _: None) -> None:
        self.source = source
        self.tty = os.isatty(source)
        if not self.tty:  # our own pipe (a terminal's flags are the shell's too: left alone)
            os.set_blocking(source, False)
        self._on_input = on_input  # what was typed (Output: a line typed ends the prompt's)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._sink = -1  # the write end of the current rank's pipe
        self._pending = b""  # read from the source, not yet taken by the pipe
        self._reading = False
        self._writing = False
        self._paused = False  # a background job's read failed (EIO): until new input
        self._edge: select.epoll | None = None  # new input on the terminal, while paused
        self._ended = False  # a pipe's end: no more input, ever
        self._ttin: signal._HANDLER = None
        self._on_closed: Callable[[], None] = lambda: None

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        if self.tty:  # a background read fails (EIO) rather than stopping us (see above)
            self._ttin = signal.signal(signal.SIGTTIN, signal.SIG_IGN)
        self._read_on()

    def rank_end(self) -> int:
        """The read end of a new pipe for the rank about to be forked (the caller closes it
        once the rank has it); what an earlier rank left unread goes with its pipe."""
        self._close_sink()
        read_end, write_end = os.pipe2(os.O_CLOEXEC)
        os.set_blocking(write_end, False)
        self._sink = write_end
        if self._ended:
            self._close_sink()
        self._read_on()
        return read_end

    def give(self, sink: int, on_closed: Callable[[], None]) -> None:
        """Relay into `sink` (owned from now on) for good; `on_closed` once it is closed."""
        self._sink = sink
        os.set_blocking(sink, False)
        self._on_closed = on_closed
        self._read_on()

    def resume(self) -> None:
        """SIGCONT, or new input: we may be the foreground job again; read if we are."""
        if self._edge is not None:
            assert self._loop is not None
            self._loop.remove_reader(self._edge.fileno())
            self._edge.close()
            self._edge = None
        self._paused = False
        self._read_on()

    def close(self) -> None:
        self.resume()
        self._close_sink()
        if self._ttin is not None:
            signal.signal(signal.SIGTTIN, self._ttin)
            self._ttin = None

    # -- reading and writing -------------------------------------------------

    def _read_on(self) -> None:
        busy = self._pending or self._paused or self._ended or self._sink < 0
        if self._loop is not None and not self._reading and not busy:
            self._loop.add_reader(self.source, self._readable)
            self._reading = True

    def _read_off(self) -> None:
        if self._reading:
            assert self._loop is not None
            self._loop.remove_reader(self.source)
            self._reading = False

    def _readable(self) -> None:
        try:
            data = os.read(self.source, CHUNK)
        except BlockingIOError:
            return
        except OSError as exc:
            if exc.errno == errno.EIO and self.tty:  # read from the background: wait for fg
                self._pause()
                return
            data = b""  # the terminal hung up: as an end
        if not data:  # ^D on a terminal (this rank's input ends), or the pipe's end
            self._ended = not self.tty
            self._read_off()
            self._close_sink()
            return
        self._on_input(data)
        self._pending = data
        self._flush()

    def _pause(self) -> None:
        """Read no more until the terminal has new input (then try once) or SIGCONT."""
        assert self._loop is not None
        self._paused = True
        self._read_off()
        if self._edge is None:
            self._edge = select.epoll()
            self._edge.register(self.source, select.EPOLLIN | select.EPOLLET)
            self._loop.add_reader(self._edge.fileno(), self._on_edge)

    def _on_edge(self) -> None:
        assert self._edge is not None
        if self._edge.poll(0):  # a whole line came (canonical mode): ours if we are in front
            self.resume()

    def _flush(self) -> None:
        while self._pending and self._sink >= 0:
            try:
                written = os.write(self._sink, self._pending)
            except BlockingIOError:
                break
            except BrokenPipeError:  # the rank closed its stdin or ended: it reads no more
                self._close_sink()
                break
            self._pending = self._pending[written:]
        if self._pending and self._sink >= 0:  # the pipe is full: the terminal keeps the rest
            self._read_off()
            if not self._writing:
                assert self._loop is not None
                self._loop.add_writer(self._sink, self._flush)
                self._writing = True
            return
        self._pending = b""
        self._write_off()
        self._read_on()

    def _write_off(self) -> None:
        if self._writing:
            assert self._loop is not None
            self._loop.remove_writer(self._sink)
            self._writing = False

    def _close_sink(self) -> None:
        self._write_off()
        self._pending = b""
        if self._sink >= 0:
            with contextlib.suppress(OSError):
                os.close(self._sink)
            self._sink = -1
            self._on_closed()
        self._read_off()


def fork_reader(group: int) -> tuple[int, int]:
    """A process in process group `group` (the terminal's job) that relays the terminal into
    a pipe: (the pipe's read end, its pid). It ignores the terminal's interrupts (they are
    the job's, passed on by the keeper), ends with us (PR_SET_PDEATHSIG) or once nobody
    reads its pipe, and stops with ^Z as the rest of the job does."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the reader
        try:
            set_parent_death_signal(signal.SIGKILL)
            signal.set_wakeup_fd(-1)
            for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
                signal.signal(signum, signal.SIG_IGN)
            signal.pthread_sigmask(signal.SIG_SETMASK, [])
            os.closerange(3, read_end)
            os.closerange(read_end + 1, write_end)
            os.closerange(write_end + 1, os.sysconf("SC_OPEN_MAX"))
            os.close(read_end)
            os.setpgid(0, group)
            asyncio.run(_read_terminal(write_end))
        finally:
            os._exit(0)
    os.close(write_end)
    return read_end, pid


async def _read_terminal(sink: int) -> None:  # pragma: no cover - in the reader
    loop = asyncio.get_running_loop()
    closed = loop.create_future()
    relay = StdinRelay(0)
    relay.attach(loop)
    loop.add_signal_handler(signal.SIGCONT, relay.resume)

    def on_closed() -> None:
        if not closed.done():
            closed.set_result(None)

    relay.give(sink, on_closed)
    await closed
