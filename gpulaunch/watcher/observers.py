"""Observers: what follows a job as its watcher runs it (the bus publisher, the record)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Protocol

from gpulaunch.model import JobProgress, JobReport, RankProgress


class Observer(Protocol):
    """Follows a job as it runs: the D-Bus publisher, the journal record, ...

    Observers see the job only as immutable `JobProgress` snapshots, and may
    ask for a graceful stop through the `stop` callback they are given.
    """

    def attach(
        self, job: JobProgress, stop: Callable[[], None], loop: asyncio.AbstractEventLoop
    ) -> None:
        """Called once, before anything starts; may add readers to the loop."""

    def changed(self, job: JobProgress, rank: RankProgress | None) -> None:
        """A rank's state changed (`rank`), or (None) the job's phase."""

    async def finished(self, job: JobProgress, report: JobReport) -> None:
        """The job ended; awaited (with a bound) before the watcher returns."""


FINISH_TIMEOUT = 2.0  # how long observers may take to publish the end of a job
