"""One rank's steps: its rate and step time over its recent reports (pure).

A rank may report every step or every tenth: a step's time is the time between
two reports over the steps between them, or the rank's own `seconds` when it
sent them (X_GPULAUNCH_STEP_SECONDS). A step number that goes back (the loop
started over) starts the window again.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from gpulaunch.model import StepInfo

WINDOW = 16  # reports the rate and the mean step time are taken over


@dataclass(frozen=True)
class Sample:
    """What one report added: the time of one of the steps it covers, and how many."""

    seconds: float
    steps: int


class StepTracker:
    """The recent steps of one rank (of one attempt)."""

    def __init__(self) -> None:
        self._marks: deque[tuple[float, int]] = deque(maxlen=WINDOW)  # (at, step)
        self._samples: deque[float] = deque(maxlen=WINDOW)  # seconds of one step
        self.total: int | None = None

    def report(
        self, step: int, total: int | None, at: float, seconds: float | None = None
    ) -> Sample | None:
        """A report of step `step` at `at` (monotonic); the sample it made, if any."""
        if total is not None:
            self.total = total
        last = self._marks[-1] if self._marks else None
        if last is not None and step < last[1]:
            self._marks.clear()
            self._samples.clear()
            last = None
        if last is not None and step == last[1]:
            return None  # nothing new (gradient accumulation repeats the global step)
        self._marks.append((at, step))
        if last is None:
            if seconds is None:
                return None
            sample = Sample(seconds, 1)
        else:
            steps = step - last[1]
            sample = Sample(seconds if seconds is not None else (at - last[0]) / steps, steps)
        self._samples.append(sample.seconds)
        return sample

    @property
    def step_seconds(self) -> float | None:
        return sum(self._samples) / len(self._samples) if self._samples else None

    def info(self, straggler: bool = False, straggled: int = 0) -> StepInfo | None:
        if not self._marks:
            return None
        (first_at, first), (at, step) = self._marks[0], self._marks[-1]
        rate = (step - first) / (at - first_at) if at > first_at else None
        return StepInfo(
            step=step,
            total=self.total,
            at=at,
            steps_per_second=rate,
            step_seconds=self.step_seconds,
            straggler=straggler,
            straggled=straggled,
        )
