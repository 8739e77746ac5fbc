"""Notices are not stops: SIGUSR1/SIGUSR2 passed on to the ranks, and the job goes on.

Slurm's `--signal=USR1@90` warns of a time limit or a preemption this way, and
Lightning's automatic requeue checkpoints on it. Each running rank's main
process gets the signal, or with --signal-whole-rank every process of the rank
(its scope or cgroup, through the supervisor).
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable, Sequence

from gpulaunch.model import RankState
from gpulaunch.recovery.preempt import PreemptPolicy, signal_name
from gpulaunch.supervisor import Supervisor
from gpulaunch.watcher.ranks import Rank


def pass_on(
    ranks: Sequence[Rank], supervisor: Supervisor, whole: bool, signum: int, rank: int | None
) -> int:
    """Send `signum` to every running rank, or to global rank `rank`; how many got it."""
    sent = 0
    for index, r in enumerate(ranks):
        if r.state is not RankState.RUNNING or rank not in (None, r.spec.rank):
            continue
        assert r.child is not None
        if whole:
            supervisor.signal_rank(index, signum)
        else:
            try:
                signal.pidfd_send_signal(r.child.pidfd, signum)
            except ProcessLookupError:
                continue
        sent += 1
    return sent


def preempt(
    ranks: Sequence[Rank],
    send: Callable[[int], int],
    policy: PreemptPolicy,
    aio: asyncio.AbstractEventLoop,
    kill: Callable[[], None],
) -> None:
    """A preemption (recovery/preempt.py): every running rank gets `policy.signal` now (`send`),
    its end is no failure whatever its status, and what still runs after the grace is killed."""
    for r in ranks:
        r.stop_requested = r.stop_requested or r.state.alive
    send(policy.signal)

    def deadline() -> None:
        if any(r.state.alive for r in ranks):
            kill()

    assert policy.grace is not None
    aio.call_later(policy.grace, deadline)


def preempt_while_stopping(signum: int, send: Callable[[int], int], policy: PreemptPolicy) -> str:
    """A preemption notice while the gang stops already (a rank failed, its restart due):
    nothing restarts, the job ends preempted (recovery/tracker.py), and the ranks still
    running get --preempt-signal too where it is not the SIGTERM the stop sent them. Their
    SIGKILL stays the stop's, --grace after it began: systemd fixed a scope's
    TimeoutStopSec= when it made it (docs/recovery.md). The line for the terminal."""
    if policy.signal != signal.SIGTERM:
        send(policy.signal)
    return (
        f"gpulaunch: {signal_name(signum)}: preempted while the ranks stop; nothing restarts, "
        f"the ranks end within --grace, the job ends preempted"
    )
