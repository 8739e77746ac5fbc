"""Ranks whose manager is gone: the watcher ends them itself (issue 22, item 2).

An ordinary user's manager stops at her logout without linger (or `loginctl
terminate-user`): it stops every unit as it goes, then nobody answers on its bus.
The stop jobs the watcher waited for went with it, and a manager that died rather
than stopped stops nothing. The watcher, the ranks' parent, ends them: SIGTERM
through each rank's pidfd now, and after the grace SIGKILL to it and, through
`cgroup.kill`, to every process of its scope's cgroup (dataloader workers too).
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Sequence

from gpulaunch.watcher.ranks import Rank


def end_ranks(ranks: Sequence[Rank], signum: int) -> None:
    """`signum` to every live rank (SIGKILL: to its whole cgroup too, where it can be)."""
    for rank in ranks:
        if rank.child is None or rank.child.pidfd < 0 or not rank.state.alive:
            continue
        with contextlib.suppress(OSError):
            signal.pidfd_send_signal(rank.child.pidfd, signum)
        if signum == signal.SIGKILL and rank.cgroup is not None:
            with contextlib.suppress(OSError):
                (rank.cgroup / "cgroup.kill").write_text("1")
