"""A check each restart's ranks must pass: the seam a supervisor offers for it.

start.py hands in `restart_check` (the GPU health gate, gpulaunch/leases/health.py: its
`Gate.check`). After `renew_gang` (a restart, --max-restarts), the first rank's `place`
contains that rank and then runs the check: an error it raises is that attempt's start
error, so the watcher stops the gang (the placed rank with it) and ends the job with the
error's line, as for any failed start. The first attempt is checked before the job starts,
so only renewed gangs are. The watcher, which knows nothing of GPUs, is not involved.
"""

from __future__ import annotations

from collections.abc import Callable


class RestartCheck:
    """Mixed into every supervisor: `renew_gang` calls `_gang_renewed`, `place`
    `_rank_placed` once the rank is contained."""

    restart_check: Callable[[], None] | None = None
    _check_pending = False

    def _gang_renewed(self) -> None:
        """A new attempt's containment is made: its first placed rank runs the check."""
        self._check_pending = True

    def _rank_placed(self) -> None:
        """A rank was placed: after a renewal, the check (its error raised to the caller)."""
        if self._check_pending:
            self._check_pending = False
            if self.restart_check is not None:
                self.restart_check()
