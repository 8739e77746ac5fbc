"""The job's timeline for its goodput: a job `Part` (gpulaunch/parts.py; goodput.py computes).

It notes from the snapshots it is handed when each attempt began, stepped first and last,
last said a checkpoint was written, failed and was gone, on the watcher's clock (the
steps' and exits' times are the watcher's own, read when they came, not when the snapshot
was made); `now()` is the job's goodput so far (the bus, the metrics), and the report
gets the final one (`complete`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import replace

from gpulaunch.model import (
    AttemptPhases,
    Cause,
    Goodput,
    JobProgress,
    JobReport,
    Phase,
    RankProgress,
)
from gpulaunch.parts import Controls, Part
from gpulaunch.progress.goodput import AttemptTimes, goodput
from gpulaunch.progress.phases import attempt_phases

# A job that ended by one of these did not fail: its last attempt's steps are all kept.
_NOT_FAILED = frozenset({Cause.SUCCEEDED, Cause.INTERRUPTED})


class Timeline(Part):
    """The attempts of a job as goodput.py needs them."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.start: float | None = None  # the start line: the job's containment exists
        self.attempts: list[AttemptTimes] = []
        self.ended: float | None = None
        self.final: Goodput | None = None
        self._rank_failed = False  # a rank of the current attempt failed (not stopped by us)
        self._ranks = 0  # the job's ranks on this node
        self._spoke: set[int] = set()  # the ranks that printed a line in the current attempt
        self._round: list[float | None] = [None, None]  # several nodes: the next round's

    def attach(self, job: JobProgress, controls: Controls, loop: asyncio.AbstractEventLoop) -> None:
        self.start = self.clock()  # (made again at `created`, where the start line is said)
        self._ranks = len(job.ranks)

    def created(self) -> None:
        self.start = self.clock()

    def before_attempt(self, attempt: int) -> None:
        if self.attempts and self.attempts[-1].attempt == attempt:
            self.attempts[-1].began = self.clock()  # (its phase said so first)
        else:
            self._new(attempt)

    def _new(self, attempt: int) -> None:
        opened, closed = self._round
        times = AttemptTimes(attempt, self.clock(), round_opened=opened, round_closed=closed)
        self.attempts.append(times)
        self._spoke, self._round = set(), [None, None]

    def round_opened(self) -> None:
        self._round = [self.clock(), None]

    def round_closed(self) -> None:
        self._round[1] = self.clock()

    def line(self, rank: int) -> None:
        """A rank printed a complete line (gpulaunch/logs/output.py's `on_line`)."""
        if not self.attempts or rank in self._spoke:
            return
        self._spoke.add(rank)
        if len(self._spoke) >= self._ranks and self.attempts[-1].first_line is None:
            self.attempts[-1].first_line = self.clock()

    def changed(self, job: JobProgress, rank: RankProgress | None) -> None:
        if not self.attempts or self.attempts[-1].attempt != job.attempt:
            self._new(job.attempt)
            self._rank_failed = False
        now = self.attempts[-1]
        self._ranks = len(job.ranks)
        if job.phase is Phase.RUNNING and now.forked is None:  # every rank forked, its gate open
            now.forked = self.clock()
        steps = [r.steps for r in job.ranks if r.steps is not None]
        firsts = [s.first_at for s in steps if s.first_at is not None]
        if firsts:
            now.first_step = min(firsts)
        if firsts and len(firsts) == len(job.ranks) and now.all_stepped is None:
            now.all_stepped = max(firsts)  # every rank's first step
        if steps:
            now.last_step = max(s.at for s in steps)
        saved = [s.checkpoint_at for s in steps if s.checkpoint_at is not None]
        if saved:
            now.checkpoint = max(saved)
        exits = [r.exit for r in job.ranks if r.exit is not None]
        failures = [e.observed_at for e in exits if e.failed and not e.stopped_by_watcher]
        if failures:
            self._rank_failed = True
            now.failed = min(failures + ([now.failed] if now.failed is not None else []))
        elif job.phase is Phase.STOPPING and now.failed is None:
            now.failed = self.clock()  # stopped for another reason (a hang, another node)
        if exits and len(exits) == len(job.ranks) and not any(r.state.alive for r in job.ranks):
            now.stopped = max(e.observed_at for e in exits)

    def now(self) -> Goodput | None:
        """The job's goodput so far (None: no rank reported a step yet)."""
        if self.final is not None or self.start is None:
            return self.final
        # a rank failed: its steps since the checkpoint are lost (a stop asked for is not
        # a failure, and a hang's or another node's shows once the report says so)
        return goodput(self.start, self.clock(), self.attempts, self._rank_failed)

    def phases(self) -> tuple[AttemptPhases, ...]:
        """Where each attempt's start went so far (phases.py)."""
        return attempt_phases(self.start, self.attempts)

    def complete(self, report: JobReport) -> JobReport:
        if self.start is None:
            return report
        self.ended = self.clock()
        failed = report.cause not in _NOT_FAILED
        self.final = goodput(self.start, self.ended, self.attempts, failed)
        return replace(report, goodput=self.final, phases=self.phases())
