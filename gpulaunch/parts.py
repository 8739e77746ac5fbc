"""A job's parts: what plugs into the watcher's run of a job, and when it is called.

The watcher (gpulaunch/watcher/loop.py) runs what every job has: fork the ranks, have
them contained, watch them, stop them, restart them. What a job may have besides is a
`Part`: its records and its publisher on the bus (gpulaunch/jobapi/), its metrics
(gpulaunch/metrics/), its front end's tether (gpulaunch/frontend/), its GPUs' lease and
health gate (gpulaunch/leases/part.py), its start line. start.py builds the job's parts in
one list, in one function (`_parts`), and hands the list to the watcher; a part overrides
the hooks it needs, the others do nothing.

The watcher calls the hooks in this order, each hook on every part in the list's order:

1. `attach(job, controls, loop)`: once, before anything of the job exists (the bus knows
   the job while it starts); `controls`: what a part may do to the job.
2. `created()`: once, when the job's containment exists, the watcher inside it.
3. For every attempt, the first and each restart's (--max-restarts, a new round):
   a. `before_attempt(attempt)`: before its first rank is forked: may it start? A
      `GpulaunchError` raised here is that attempt's start error: the gang stops and the
      job ends with the error's line, as when a rank could not be contained.
   b. `rank_setup(rank, attempt)`: as each rank is forked: the environment it adds, the
      fds the rank inherits (at 3, 4, ... in the list's order).
   c. `changed(job, rank)`: whenever a rank's state changes (`rank`; a rank ended: its
      `exit` is set) or the job's phase (`rank` None).
   d. several nodes, after a round's gang ended and before the next attempt's `changed`:
      `round_opened()` as this node joins the next rendezvous round, `round_closed()` once
      that round settled (the next attempt's world is known).
4. `complete(report)`: once, after the last attempt: the report with what the part adds,
   each part handed the one before it completed.
5. `finished(job, report)`: the report is final; awaited, at most FINISH_TIMEOUT seconds
   each (also after a failed start: it is recorded too).
6. `close()`: once, last, on every way out of the run (also when it raised).

Parts see the job only as immutable `JobProgress` snapshots and reports, never the
watcher itself.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field

from gpulaunch.model import JobProgress, JobReport, RankProgress, RankSpec

FINISH_TIMEOUT = 2.0  # how long each part may take to hear the end of a job


def _nobody(signum: int, rank: int | None) -> int:
    return 0


@dataclass(frozen=True)
class Controls:
    """What a part may do to the job it is attached to."""

    stop: Callable[[], None]  # stop it gracefully, as a first SIGTERM would (`gpulaunch stop`)
    # a notice (SIGUSR1, ...) to its running ranks (a global rank, or None: all); how many got it
    signal_ranks: Callable[[int, int | None], int] = _nobody


@dataclass(frozen=True)
class RankSetup:
    """What a part adds to a rank it is forked with."""

    env: Mapping[str, str] = field(default_factory=dict)
    fds: tuple[int, ...] = ()  # inherited at 3, 4, ... (the parts' in the list's order)


class Part:
    """One optional part of a job; every hook does nothing unless overridden."""

    def attach(self, job: JobProgress, controls: Controls, loop: asyncio.AbstractEventLoop) -> None:
        """Once, before anything of the job exists; may add readers to the loop."""

    def created(self) -> None:
        """Once, the job's containment exists."""

    def before_attempt(self, attempt: int) -> None:
        """Before an attempt's first rank is forked; raises GpulaunchError: it may not."""

    def rank_setup(self, rank: RankSpec, attempt: int) -> RankSetup:
        """What `rank` gets from this part as it is forked for `attempt`."""
        return RankSetup()

    def changed(self, job: JobProgress, rank: RankProgress | None) -> None:
        """A rank's state changed (`rank`), or (None) the job's phase."""

    def round_opened(self) -> None:
        """Several nodes: this node joins the next rendezvous round."""

    def round_closed(self) -> None:
        """Several nodes: the round settled; the next attempt begins."""

    def complete(self, report: JobReport) -> JobReport:
        """The job's report with what this part adds to it."""
        return report

    async def finished(self, job: JobProgress, report: JobReport) -> None:
        """The job ended; awaited (with a bound) before the watcher returns."""

    def close(self) -> None:
        """Last, on every way out of the watcher's run."""


class Parts(Part):
    """A job's parts as one: each hook called on every part, in the list's order (`close`:
    in the reverse order, every part's even when one raises)."""

    def __init__(self, parts: Sequence[Part] = ()) -> None:
        self.parts = tuple(parts)

    def __bool__(self) -> bool:
        return bool(self.parts)

    def attach(self, job: JobProgress, controls: Controls, loop: asyncio.AbstractEventLoop) -> None:
        for part in self.parts:
            part.attach(job, controls, loop)

    def created(self) -> None:
        for part in self.parts:
            part.created()

    def before_attempt(self, attempt: int) -> None:
        for part in self.parts:
            part.before_attempt(attempt)

    def rank_setup(self, rank: RankSpec, attempt: int) -> RankSetup:
        env: dict[str, str] = {}
        fds: tuple[int, ...] = ()
        for part in self.parts:
            setup = part.rank_setup(rank, attempt)
            env.update(setup.env)
            fds += setup.fds
        return RankSetup(env, fds)

    def changed(self, job: JobProgress, rank: RankProgress | None) -> None:
        for part in self.parts:
            part.changed(job, rank)

    def round_opened(self) -> None:
        for part in self.parts:
            part.round_opened()

    def round_closed(self) -> None:
        for part in self.parts:
            part.round_closed()

    def complete(self, report: JobReport) -> JobReport:
        for part in self.parts:
            report = part.complete(report)
        return report

    async def finished(self, job: JobProgress, report: JobReport) -> None:
        for part in self.parts:
            await asyncio.wait_for(part.finished(job, report), FINISH_TIMEOUT)

    def close(self) -> None:
        with ExitStack() as stack:
            for part in self.parts:
                stack.callback(part.close)
