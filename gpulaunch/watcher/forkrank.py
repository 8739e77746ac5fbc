"""Forking one rank and its log pump, both held at their gates, wired by pipes.

The rank writes into two pipes (stdout, stderr) read by its log pump, which
feeds the journal and passes every line on through two more pipes to the
watcher's terminal output (logs/output.py). Both processes are held at their
gates (base/procs.py) until the supervisor has contained them.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence

from gpulaunch.base.procs import HeldChild, fork_held, spawn_held
from gpulaunch.logs.pump import IGNORED_SIGNALS, JournalTarget, run_pump
from gpulaunch.watcher.ranks import Rank


def fork_rank(
    rank: Rank,
    env: Mapping[str, str],
    target: JournalTarget | None,
    death_signal: int,
    born: Callable[[Rank], None],
    stdin: Callable[[int], tuple[int, bool]] | None = None,
    inherited: Sequence[int] = (),
    spawn: Callable[[Sequence[str], Mapping[str, str], Mapping[int, int], int], HeldChild] = (
        spawn_held
    ),
) -> tuple[int, int]:
    """Fork `rank` (its `child`) and its log pump (its `pump`), both held at their gates.

    `born(rank)` is told as soon as the rank's process exists, before its pump is forked,
    so that a failure forking the pump leaves no rank unwatched. `stdin(rank)`: the rank's
    fd 0 and whether to close it here (watcher/terminal.py; None: the watcher's). Returns
    the read ends of the live stdout and stderr pipes, for the terminal's output.
    `inherited`: fds the rank gets at 3, 4, ... (the job's parts', gpulaunch/parts.py: a GPU
    lease's lasts as long as its ranks). `spawn`: how the rank's process is made, held at
    its gate (a new interpreter, or a fork of the warm process: gpulaunch/warm/).
    """
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    live_out_r, live_out_w = os.pipe()
    live_err_r, live_err_w = os.pipe()
    hold_r = rank.hold_pump()  # the pump's exit waits for the watcher's read of the cgroup
    stdin_fd, own = stdin(rank.spec.rank) if stdin is not None else (0, False)
    try:
        fds = {0: stdin_fd, 1: out_w, 2: err_w, **{3 + i: fd for i, fd in enumerate(inherited)}}
        rank.child = spawn(rank.spec.argv, dict(env), fds, death_signal)
        born(rank)
        rank.pump = fork_held(
            lambda: run_pump(
                {"stdout": 3, "stderr": 4},
                {"stdout": 5, "stderr": 6},
                target,
                rank.spec.rank,
                hold=7,
            ),  # fmt: skip
            {3: out_r, 4: err_r, 5: live_out_w, 6: live_err_w, 7: hold_r},
            ignore=IGNORED_SIGNALS,
            death_signal=death_signal,
        )
    except BaseException:
        os.close(live_out_r)
        os.close(live_err_r)
        raise
    finally:
        for fd in (out_r, out_w, err_r, err_w, live_out_w, live_err_w, hold_r):
            os.close(fd)
        if own:
            os.close(stdin_fd)
    return live_out_r, live_err_r
