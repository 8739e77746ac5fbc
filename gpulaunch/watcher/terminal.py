"""A torchrun user's hands at a terminal: its input for one rank, its Ctrl-C as SIGINT.

- **Input** (`--stdin-rank N`, rank 0 by default; `none`): that rank's stdin is what the
  watcher's stdin gives, through a pipe the watcher fills (base/stdin.py: a rank, its own
  process group, may not read the terminal itself) where it is a terminal or a pipe, as is
  where it is a file; every other rank's is /dev/null, and a terminal's user is told so in
  one line. `--detach`: the watcher's stdin is /dev/null already. The stdin rank's line so
  far is shown at once, so that a prompt without a newline (pdb's `(Pdb) `, `input()`'s)
  is on the screen while it waits (logs/output.py, `prompt_rank`).
- **Ctrl-C**: the terminal signals its foreground group, which is the watcher's (the ranks
  are groups of their own), or an ordinary user's front end, which passes it to the
  watcher. Under torchrun the ranks are in that group and get SIGINT, so
  `except KeyboardInterrupt:` runs; here the watcher sends every running rank's process
  group SIGINT once, as the terminal would have, gives them --grace, then kills what still
  runs (the second Ctrl-C at once). The job's status is 130. SIGTERM and SIGHUP stop the
  gang as ever (SIGTERM to the ranks).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Callable, Sequence
from contextlib import ExitStack

from gpulaunch.base.stdin import StdinRelay, fork_reader, others_line, relayable
from gpulaunch.logs.output import Output
from gpulaunch.model import RankState
from gpulaunch.supervisor import Supervisor
from gpulaunch.watcher.ranks import Rank


class RankStdin:
    """Which stdin each rank of this node gets (`stdin_rank`: a global rank, or None)."""

    def __init__(self, stdin_rank: int | None, world_size: int, output: Output) -> None:
        self.rank = stdin_rank
        self.output = output
        self.relay: StdinRelay | None = None
        self._line = others_line(stdin_rank, world_size) if os.isatty(0) else None
        self._null = -1
        self.readers: tuple[int, ...] = ()  # the pid of a reader in the keeper's group

    def attach(
        self, aio: asyncio.AbstractEventLoop, stack: ExitStack, supervisor: Supervisor
    ) -> None:
        """Relay the stdin rank's input from now on (before the job's containment: a reader
        process is the watcher's, `readers`, never a rank's leftover)."""
        stack.callback(self.close)
        if self._line is not None:
            self.output.message(self._line)
        if self.rank is None or not relayable(0):
            return
        source = 0
        keeper = supervisor.keeper
        if keeper is not None and os.isatty(0):  # we are not in the terminal's job: it is
            source, reader = fork_reader(os.getpgid(keeper.pid))
            self.readers = (reader,)
        self.relay = StdinRelay(source, self.output.input_seen)
        self.output.prompt_rank = self.rank
        self.relay.attach(aio)

    def fd_for(self, rank: int) -> tuple[int, bool]:
        """The fd that is global rank `rank`'s stdin, and whether to close it once forked."""
        if rank == self.rank:
            if self.relay is not None:
                return self.relay.rank_end(), True
            return 0, False
        if self._null < 0:
            self._null = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        return self._null, False

    def resume(self) -> None:
        """SIGCONT: the job may be in the foreground again."""
        if self.relay is not None:
            self.relay.resume()

    def close(self) -> None:
        if self.relay is not None:
            self.relay.close()
            if self.relay.source != 0:
                os.close(self.relay.source)
        for pid in self.readers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)  # our unreaped child: the pid is its own
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
        self.readers = ()
        if self._null >= 0:
            os.close(self._null)
            self._null = -1


def interrupt_ranks(
    ranks: Sequence[Rank], aio: asyncio.AbstractEventLoop, grace: float, kill: Callable[[], None]
) -> None:
    """Ctrl-C: SIGINT to every running rank's process group, once; their ends are no
    failure whatever their status; what still runs after `grace` is killed (`kill`)."""
    for rank in ranks:
        rank.stop_requested = rank.stop_requested or rank.state.alive
        if rank.state is not RankState.RUNNING or rank.child is None or rank.child.pidfd < 0:
            continue
        try:  # its group: the rank and what it started (dataloader workers), as a terminal's
            os.killpg(rank.child.pid, signal.SIGINT)  # not reaped: its pid is still its group's
        except ProcessLookupError:  # it made a session or group of its own: the rank alone
            try:
                signal.pidfd_send_signal(rank.child.pidfd, signal.SIGINT)
            except ProcessLookupError:
                pass

    def deadline() -> None:
        if any(rank.state.alive for rank in ranks):
            kill()

    aio.call_later(grace, deadline)
