"""One rank's steps: its rate and step time over its recent reports (pure).

A rank may report every step or every tenth: a step's time is the time between
two reports over the steps between them, or the rank's own `seconds` when it
sent them (X_GPULAUNCH_STEP_SECONDS). A step number that goes back (the loop
started over) starts the window again. The first report's time and the last checkpoint
notice (`checkpoint(n)`) are kept for the attempt's goodput (goodput.py).
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
        self.first_at: float | None = None  # the first step report's time, kept on a reset
        self.checkpoint: tuple[int, float] | None = None  # (step, at) of the last notice

    def saved(self, step: int, at: float) -> None:
        """A checkpoint of step `step` was written (the rank said so at `at`)."""
        self.checkpoint = (step, at)

    def report(
        self, step: int, total: int | None, at: float, seconds: float | None = None
    ) -> Sample | None:
        """A report of step `step` at `at` (monotonic); the sample it made, if any."""
        if total is not None:
            self.total = total
        if self.first_at is None:
            self.first_at = at
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
            first_at=self.first_at,
            checkpoint=None if self.checkpoint is None else self.checkpoint[0],
            checkpoint_at=None if self.checkpoint is None else self.checkpoint[1],
        )
