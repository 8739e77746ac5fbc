"""Which ranks are stragglers (--straggler-factor, --straggler-steps): pure decisions.

A rank is flagged when its step time stays above `factor` times the median of
the other ranks' recent step times for `steps` of its steps in a row, and
cleared when it stays at or below that for as many steps (the same count both
ways, so that a rank near the line does not flicker). Ranks with no step time
yet are not "the others"; one rank alone is never a straggler.

Ranks that wait for each other in a collective every step all take the slowest
one's time: their wall step times are equal, and nobody is flagged. A rank that
sends its own step time (`step(n, seconds=...)`, measured up to the collective)
is judged by that instead.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field

from gpulaunch.model import StragglerRule
from gpulaunch.progress.tracker import Sample


@dataclass(frozen=True)
class Verdict:
    """A rank's flag changed."""

    rank: int
    straggler: bool
    seconds: float  # its step time that decided it
    others: float  # the median of the others' step times


@dataclass
class Stragglers:
    """The straggler flags of one attempt's ranks."""

    rule: StragglerRule
    flagged: set[int] = field(default_factory=set)
    times: dict[int, int] = field(default_factory=dict)  # how often each was flagged
    _run: dict[int, int] = field(default_factory=dict)  # steps in a row on the other side

    def judge(self, rank: int, sample: Sample, others: Mapping[int, float]) -> Verdict | None:
        """Rank `rank` reported `sample`; `others`: the other ranks' recent step times.
        The change of its flag, if it changed."""
        if not others:
            self._run.pop(rank, None)
            return None
        median = statistics.median(others.values())
        slow = sample.seconds > self.rule.factor * median
        if slow == (rank in self.flagged):
            self._run.pop(rank, None)  # on its side of the line: the count starts again
            return None
        run = self._run.get(rank, 0) + sample.steps
        if run < self.rule.steps:
            self._run[rank] = run
            return None
        self._run.pop(rank, None)
        if slow:
            self.flagged.add(rank)
            self.times[rank] = self.times.get(rank, 0) + 1
        else:
            self.flagged.discard(rank)
        return Verdict(rank, slow, sample.seconds, median)
