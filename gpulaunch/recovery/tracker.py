"""The watcher's record of its attempts: what failed, what was decided, whether preempted.

One object the watcher (gpulaunch/watcher/loop.py) calls after each attempt (`after`)
and when a preemption notice comes (`preempted`); `outcome` then turns the exit-status
rules' outcome into the job's: a crash loop's, a preemption's or a requeue's own status;
`complete` adds what a Slurm job's next run carries over (requeue.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from gpulaunch.model import (
    CRASH_LOOP_STATUS,
    PREEMPTED_STATUS,
    REQUEUE_STATUS,
    Carried,
    Cause,
    JobReport,
    Outcome,
    RankExit,
)
from gpulaunch.recovery.failure import Failure, classify
from gpulaunch.recovery.policy import (
    Decision,
    Verdict,
    crash_loop_length,
    decide,
    earlier_failures,
)
from gpulaunch.recovery.preempt import DEADLINE_FILE_ENV, PreemptPolicy, write_deadline
from gpulaunch.recovery.requeue import Requeues
from gpulaunch.recovery.settings import RecoveryOptions, RestartPolicy


@dataclass
class Recovery:
    """The failures of a job's attempts so far, the last decision, and its preemption."""

    max_restarts: int = 0
    options: RecoveryOptions = RecoveryOptions()
    failures: list[Failure] = field(default_factory=list)
    decision: Decision | None = None  # after the last failed attempt
    stepped: bool = False  # the attempt that ends now: a rank reported a step (the watcher says)
    preempted_at: float | None = None  # monotonic: when the notice came
    deadline_file: Path | None = None  # where the ranks look for their deadline
    last_failed: bool = False  # the last attempt that ended failed (else: no streak to carry)

    @property
    def policy(self) -> RestartPolicy:
        return self.options.restart

    @property
    def preempt(self) -> PreemptPolicy:
        return self.options.preempt

    @property
    def requeue(self) -> Requeues:
        return self.options.requeue

    def after(
        self, outcome: Outcome, exits: Mapping[int, RankExit], stopping: bool
    ) -> Decision | None:
        """An attempt ended with `outcome`: restart it? None: it did not fail (no restart)."""
        failure = classify(outcome, exits)
        self.last_failed = failure is not None
        if failure is None:
            return None
        self.failures.append(replace(failure, stepped=self.stepped))
        stopping = stopping or self.preempted_at is not None
        self.decision = decide(
            self.options.restart, self.max_restarts, self.failures, stopping, self.requeue
        )
        return self.decision

    def restart(
        self,
        report: JobReport,
        exits: Mapping[int, RankExit],
        stopping: bool,
        say: Callable[[str], None],
    ) -> bool:
        """After an attempt (`report`: the job's report if it ended now), restart the gang?
        `say` gets the line that says so and why; a line that says why not is the report's
        (`line`), said once there."""
        outcome = Outcome(report.status, report.cause, report.cause_rank)
        decision = self.after(outcome, exits, stopping)
        if decision is not None and decision.restart and decision.line is not None:
            say(decision.line)
        return decision is not None and decision.restart

    def rank_environment(self, directory: Path) -> dict[str, str]:
        """What a rank is told of a preemption; its deadline goes under `directory` (ours)."""
        env = self.preempt.rank_environment(directory)
        if DEADLINE_FILE_ENV in env:
            self.deadline_file = Path(env[DEADLINE_FILE_ENV])
        return env

    def preempted(self, signum: int, now: float) -> bool:
        """Is `signum` a preemption notice, the first? Then it is recorded, and the ranks'
        deadline written (before they get the signal; if it cannot be, the grace in their
        environment still tells them)."""
        if self.preempted_at is not None or not self.preempt.is_notice(signum):
            return False
        self.preempted_at = now
        if self.deadline_file is not None and self.preempt.grace is not None:
            write_deadline(self.deadline_file, time.time() + self.preempt.grace)
        return True

    def outcome(self, outcome: Outcome, interrupt: tuple[float, int] | None = None) -> Outcome:
        """The job's outcome: a crash loop's, a preemption's or an interrupt's (`interrupt`:
        the watcher's first, (time, signal)) when it ended the job, or the exit-status
        rules' (`outcome`). An interrupt that came while a failed attempt's gang stopped
        for a restart ends the job as if it had come first: it wins over the restart."""
        won = self.decision is not None and self.decision.verdict is Verdict.INTERRUPTED
        if won and self.preempted_at is None and interrupt is not None:
            return Outcome(128 + interrupt[1], Cause.INTERRUPTED, None)
        if (outcome.cause is Cause.INTERRUPTED or won) and self.preempted_at is not None:
            return Outcome(PREEMPTED_STATUS, Cause.PREEMPTED, None)
        if self.decision is not None and self.decision.verdict is Verdict.CRASH_LOOP:
            if outcome.cause is not Cause.INTERRUPTED:
                return Outcome(CRASH_LOOP_STATUS, Cause.CRASH_LOOP, outcome.cause_rank)
        if self.decision is not None and self.decision.verdict is Verdict.REQUEUE:
            if outcome.cause is not Cause.INTERRUPTED:
                return Outcome(REQUEUE_STATUS, Cause.REQUEUE, outcome.cause_rank)
        return outcome

    def carried(self, attempt: int, ended: bool = True) -> Carried | None:
        """What a Slurm job's next run carries over (`attempt`: the number of the last
        attempt, counted over the job's runs); None outside Slurm. While the job runs
        (`ended` False, its live records): the attempts only, as its watcher may be killed
        after this attempt made progress."""
        if not (ended and self.last_failed and self.failures):  # its last attempt did not fail
            return self.requeue.carry(attempt + 1, 0, "", 0)
        every = [*earlier_failures(self.requeue), *self.failures]
        last = self.failures[-1]
        streak = crash_loop_length(self.policy, every)
        return self.requeue.carry(attempt + 1, streak, last.kind.value, last.status)

    def complete(self, report: JobReport, attempt: int) -> JobReport:
        """The report with what a Slurm job's next run carries over (`carried`)."""
        carried = self.carried(attempt)
        return report if carried is None else replace(report, carried=carried)

    @property
    def line(self) -> str | None:
        """Why restarts ended, for the report (None: nothing to say)."""
        if self.decision is None or self.decision.restart:
            return None
        return self.decision.line
