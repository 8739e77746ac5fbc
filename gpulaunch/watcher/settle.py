"""When every rank ended by itself: how long to let their output settle before the gang stop.

The ranks slice is stopped anyway, so that nothing a rank left behind outlives
it; but the log pumps may still hand their backlog to journald (wait for them, up
to the grace), and a pump may not have read a rank's last chunk yet when the
rank is reaped. A stream still open LEFTOVER_S after the last rank ended is held
by something the ranks left behind: then the stop comes at once.
"""

from __future__ import annotations

from dataclasses import dataclass

LEFTOVER_S = 1.0


@dataclass
class Settle:
    """The deadlines of one attempt's end (a new one per attempt)."""

    grace: float
    leftover_deadline: float | None = None
    drain_deadline: float | None = None

    def wait(self, now: float, streams_open: bool, pumps_done: bool) -> tuple[float, bool] | None:
        """(seconds to wait, whether that deadline is new: wake up then), or None: stop now."""
        fresh = False
        if streams_open:
            if self.leftover_deadline is None:
                self.leftover_deadline, fresh = now + min(LEFTOVER_S, self.grace), True
            left = self.leftover_deadline - now
        elif not pumps_done:
            if self.drain_deadline is None:
                self.drain_deadline, fresh = now + self.grace, True
            left = self.drain_deadline - now
        else:
            return None
        return (left, fresh) if left > 0 else None
