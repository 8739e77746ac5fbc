"""--hang-timeout and --dump-stacks in the watcher's loop: the timer, the CPU reads, the stacks.

The decisions are debug/hang.py's; this module runs them on the watcher's loop:
one `call_at` deadline at a time (never more often than every half timeout),
CPU read at the deadline, and py-spy run as asyncio subprocesses, so signals
and exits are handled while the stacks are taken.

Where ranks report steps (gpulaunch/progress/), only a step is a sign of life:
the job hangs when no rank stepped for the timeout, whatever they print or
compute, and the deadline is exactly the last step plus the timeout.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from pathlib import Path

from gpulaunch.debug.hang import HangClock, cpu_seconds, hang_summary
from gpulaunch.debug.stacks import RankStacks, dump_ranks, find_pyspy, format_stacks
from gpulaunch.model import StepInfo
from gpulaunch.progress.behind import behind
from gpulaunch.report import NO_STEP
from gpulaunch.watcher.ranks import Rank

HUNG = "the job hung (--hang-timeout)"

STACK_FRAMES = 12  # frames per thread in the report (the file has all of them)
REPORT_MAX = 16 << 10  # characters of stacks in the report


class HangWatch:
    """Finds a hung job and takes the ranks' stacks, for the watcher."""

    def __init__(
        self,
        timeout: float | None,
        dump_stacks: bool,
        clock: Callable[[], float],
        last_output: Callable[[], float],
        stacks_file: Path,
        pyspy: str | None = None,
    ) -> None:
        self.timeout = timeout
        self.dump_stacks = dump_stacks
        self.clock = clock
        self.last_output = last_output
        self.stacks_file = stacks_file
        self.pyspy: str | None = None
        self.hung_at: float | None = None
        self.summary: str | None = None  # where the ranks were (which collective)
        self.steps_why: str | None = None  # hung by steps: who stepped last, who is behind
        self.stacks: str | None = None  # the report's bounded text
        self._timer: asyncio.TimerHandle | None = None
        self._aio: asyncio.AbstractEventLoop | None = None
        self.say: Callable[[str], None] = lambda text: None  # a line on the terminal
        if timeout is not None or dump_stacks:
            # checked before the job starts (by start.py, or here): one line if missing
            self.pyspy = pyspy or find_pyspy()

    def start(
        self,
        aio: asyncio.AbstractEventLoop,
        ranks: Callable[[], Sequence[Rank]],
        on_hung: Callable[[str], None],
    ) -> None:
        """The ranks run: arm the first deadline. `on_hung` gets the reason."""
        self.cancel()
        self.steps_why = None  # (a new attempt)
        if self.timeout is None:
            return
        self._aio, timeout = aio, self.timeout
        clock = HangClock(self.timeout, self.clock())

        def check() -> None:
            now = self.clock()
            stepped = last_step(ranks(), clock.started)
            if stepped is not None:  # the ranks report steps: nothing else is progress
                at = stepped[1].at
                if now < at + timeout:
                    self._timer = aio.call_at(aio.time() + (at + timeout - now), check)
                    return
                self.hung_at = now
                where = behind({r.spec.rank: r.steps.step if r.steps else None for r in ranks()})
                why = f"{NO_STEP} for {now - at:.1f} s ({where})"
                self.say(f"gpulaunch: job hung (--hang-timeout {timeout:g}): {why}")
                self.steps_why = self.summary = why  # the headline's (report.py), not "no CPU"
                on_hung(f"{HUNG}: {why}")
                return
            cpu = {
                r.spec.rank: seconds
                for r in ranks()
                if r.child is not None and r.state.alive
                for seconds in [cpu_seconds(r.child.pid)]
                if seconds is not None
            }
            due = clock.check(now, self.last_output(), cpu)
            if due is None:
                self.hung_at = now
                on_hung(HUNG)
            else:
                self._timer = aio.call_at(aio.time() + (due - now), check)

        self._timer = aio.call_at(aio.time() + self.timeout / 2, check)

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    async def take(self, ranks: Sequence[Rank], why: str) -> None:
        """The stacks of the live ranks: the summary, the report's excerpt and the file."""
        assert self.pyspy is not None
        targets = [
            (r.spec.rank, r.spec.unit, r.child.pid)
            for r in ranks
            if r.child is not None and r.state.alive
        ]
        taken: Sequence[RankStacks] = await dump_ranks(self.pyspy, targets) if targets else ()
        self.summary = "; ".join(t for t in (self.steps_why, hang_summary(taken)) if t) or None
        full = "\n\n".join(format_stacks(s) for s in taken)
        short = "\n".join(format_stacks(s, limit=STACK_FRAMES) for s in taken)
        if len(short) > REPORT_MAX:
            short = short[:REPORT_MAX] + "\n[... cut: see the file ...]"
        try:
            self.stacks_file.parent.mkdir(parents=True, exist_ok=True)
            self.stacks_file.write_text(f"{why}\n\n{full}\n")
            where = f"all frames: {self.stacks_file}"
        except OSError as exc:  # the report still has them
            where = f"could not write {self.stacks_file}: {exc.strerror}"
        self.stacks = f"{short}\n({where})"


def last_step(ranks: Sequence[Rank], since: float) -> tuple[int, StepInfo] | None:
    """The rank that stepped last since `since` (this attempt), and its steps; None: none."""
    steps = [(r.steps, r.spec.rank) for r in ranks if r.steps is not None and r.steps.at >= since]
    if not steps:
        return None
    info, rank = max(steps, key=lambda s: s[0].at)
    return rank, info
