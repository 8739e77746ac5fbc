"""Notices are not stops: SIGUSR1/SIGUSR2 passed on to the ranks, and the job goes on.

Slurm's `--signal=USR1@90` warns of a time limit or a preemption this way, and
Lightning's automatic requeue checkpoints on it. Each running rank's main
process gets the signal, or with --signal-whole-rank every process of the rank
(its scope or cgroup, through the supervisor).
"""

from __future__ import annotations

import signal
from collections.abc import Sequence

from gpulaunch.model import RankState
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
