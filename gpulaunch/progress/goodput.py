"""A job's goodput from its timeline: ETTR and what each failure cost (pure; docs/progress.md).

The measure is Meta's effective training time ratio (ETTR: productive training time over
wall time, with the work lost at each failure since the last checkpoint; Kokolis et al.,
"Revisiting Reliability in Large-Scale Machine Learning Research Clusters", 2024), taken
from what the watcher saw, on one clock (CLOCK_MONOTONIC):

- an attempt *steps* from its first step report to its last (any rank's: the gang's);
- a failed attempt (one that was restarted, or the last one when the job ended by a failure)
  loses its steps after its last checkpoint notice (`checkpoint(n)`; without one in that
  attempt, all of them): they are *redone*;
- *productive* time is the sum of the attempts' stepping spans less what was redone;
- a failure costs `redone + detection + stop + restart`: from its last checkpoint (or its
  first step) to the next attempt's first step, split at its last step, at the failure
  seen and at its gang gone;
- *wall* time runs from the start line to the end (or now); ETTR = productive / wall.

So wall = startup (start line to the first step) + productive + lost + the rest (after
the last step: a success's teardown, or the end after a failure that was not restarted),
every second in exactly one of them; an attempt that never stepped is inside the restart
of the failure before it (or the startup). No step reported: no goodput (None), never 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gpulaunch.model import Goodput, Loss


@dataclass
class AttemptTimes:
    """What the watcher saw of one attempt (monotonic seconds; None: not, or not yet)."""

    attempt: int
    began: float  # its ranks were about to be forked
    first_step: float | None = None  # its first step report, any rank's
    last_step: float | None = None  # its last step report, any rank's
    checkpoint: float | None = None  # its last checkpoint notice, any rank's
    failed: float | None = None  # the failure seen (a rank failed, or the gang stop began)
    stopped: float | None = None  # its last rank ended
    # where its start went (phases.py): every rank forked, every rank's first output line,
    # every rank's first step report
    round_opened: float | None = None  # several nodes: this node joined its round
    round_closed: float | None = None  # several nodes: its round settled
    forked: float | None = None
    first_line: float | None = None
    all_stepped: float | None = None


def goodput(
    start: float, now: float, attempts: Sequence[AttemptTimes], last_failed: bool
) -> Goodput | None:
    """The job's goodput from its start line (`start`) to `now` (its end, or now);
    `last_failed`: the last attempt failed (the job ended by a failure, or it is being
    stopped after one). None when no rank reported a step."""
    stepped = [a for a in attempts if a.first_step is not None and a.last_step is not None]
    if not stepped:
        return None
    productive = 0.0
    losses = []
    for i, a in enumerate(stepped):
        assert a.first_step is not None and a.last_step is not None
        first, last = a.first_step, max(a.last_step, a.first_step)
        following = stepped[i + 1] if i + 1 < len(stepped) else None
        restarted = a is not attempts[-1]  # a later attempt began: this one failed
        if not restarted and not last_failed:
            productive += last - first
            continue
        kept = first if a.checkpoint is None else min(max(a.checkpoint, first), last)
        seen = max(a.failed if a.failed is not None else _or(a.stopped, now), last)
        gone = max(_or(a.stopped, now), seen)
        restart = None
        if following is not None:
            assert following.first_step is not None
            restart = max(0.0, following.first_step - gone)
        productive += kept - first
        losses.append(Loss(a.attempt, last - kept, seen - last, gone - seen, restart))
    return Goodput(
        wall=max(0.0, now - start),
        productive=productive,
        startup=max(0.0, _or(stepped[0].first_step, now) - start),
        losses=tuple(losses),
        checkpoints=any(a.checkpoint is not None for a in attempts),
    )


def _or(value: float | None, default: float) -> float:
    return default if value is None else value
