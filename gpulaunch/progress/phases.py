"""Where the time of each attempt's start goes: its phases from its timeline (pure;
docs/recovery.md, "Where the time goes").

An attempt after a failure counts from that failure seen (the attempt before's `failed`):
the ranks stopped (its last rank gone), several nodes: the round opened (this node joined
it) and closed (it settled), the new ranks forked (every one, its gate open), every rank's
first output line, every rank's first step report. The first attempt counts from the
start line. The times are the watcher's (CLOCK_MONOTONIC); a phase it did not see (a rank
that prints nothing, no progress channel, one node: no round) is absent, never a made-up 0.
"""

from __future__ import annotations

from collections.abc import Sequence

from gpulaunch.model import PHASES, AttemptPhases
from gpulaunch.progress.goodput import AttemptTimes


def attempt_phases(
    start: float | None, attempts: Sequence[AttemptTimes]
) -> tuple[AttemptPhases, ...]:
    """Each attempt's phases, in seconds since its origin (the failure seen, or `start`)."""
    out = []
    for i, a in enumerate(attempts):
        seen: dict[str, float | None] = {}
        if i == 0:
            origin, since = start, "start"
        else:
            before = attempts[i - 1]
            origin, since = (
                before.failed if before.failed is not None else before.stopped,
                "failure",
            )
            seen = {"failure_seen": before.failed, "ranks_stopped": before.stopped}
        if origin is None:
            origin = a.began
        seen |= {"round_opened": a.round_opened, "round_closed": a.round_closed}
        seen |= {"ranks_forked": a.forked, "first_line": a.first_line, "first_step": a.all_stepped}
        phases = tuple(
            (name, max(0.0, at - origin))
            for name in PHASES
            for at in [seen.get(name)]
            if at is not None
        )
        out.append(AttemptPhases(a.attempt, since, phases))
    return tuple(out)
