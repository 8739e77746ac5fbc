"""After a failed attempt: restart the gang, or end the job now, and why.

The defaults (docs/recovery.md says why): a non-zero exit, a death by signal, a hang
and another node's failure restart (while --max-restarts allows); an OOM kill does not
(the same code with the same memory fails the same way, after the same time, and a
crash loop's test does not catch a failure that comes late); exit code 78 (EX_CONFIG,
"configuration error") never does; 3 attempts in a row that fail the same way, each
before it made progress, are a crash loop and end the job (status 80), also when some of
them were an earlier Slurm run's (requeue.py). With --max-requeues left, a failure that
would restart ends the run with "requeue me" (status 81) once --max-restarts are spent.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

from gpulaunch.recovery.classes import FailureClass
from gpulaunch.recovery.failure import Failure
from gpulaunch.recovery.progress import made_progress
from gpulaunch.recovery.requeue import Requeues
from gpulaunch.recovery.settings import RestartPolicy


class Verdict(enum.StrEnum):
    """What follows a failed attempt."""

    RESTART = "restart"
    SPENT = "spent"  # --max-restarts restarts were made (or none were allowed)
    NO_RESTART_CODE = "no-restart-code"  # the script said "do not restart" by its exit code
    NOT_RESTARTED = "not-restarted"  # its class is not in --restart-on
    CRASH_LOOP = "crash-loop"  # --crash-loop attempts in a row failed the same way
    REQUEUE = "requeue"  # --max-restarts spent, --max-requeues left: "requeue me" (81)
    STOPPING = "stopping"  # the job was interrupted or preempted meanwhile: it ends
    # a restart was due, but an interrupt or a preemption came while the gang stopped:
    # the interrupt wins, gets its grace, and is the job's cause (tracker.py, `outcome`)
    INTERRUPTED = "interrupted"


@dataclass(frozen=True)
class Decision:
    """The verdict and the line that tells the user (None: nothing worth a line)."""

    verdict: Verdict
    line: str | None = None

    @property
    def restart(self) -> bool:
        return self.verdict is Verdict.RESTART


def crash_loop_length(policy: RestartPolicy, failures: Sequence[Failure]) -> int:
    """How many of the last attempts failed the same way as the last, none with progress."""
    if not failures:
        return 0
    last = failures[-1].signature
    length = 0
    for failure in reversed(failures):
        if failure.signature != last or made_progress(failure, policy.progress_after):
            break
        length += 1
    return length


NO_REQUEUES = Requeues()  # not in Slurm, or no --max-requeues and no earlier run


def earlier_failures(requeue: Requeues) -> tuple[Failure, ...]:
    """The failures in a row that ended a Slurm job's earlier runs (requeue.py), as this
    run's crash-loop rule counts them: none with progress."""
    c = requeue.earlier
    if c is None or not c.streak or c.streak_class not in set(FailureClass):
        return ()
    what = f"an earlier run's failure (status {c.streak_status})"
    return (Failure(FailureClass(c.streak_class), c.streak_status, what, 0.0),) * c.streak


def decide(
    policy: RestartPolicy,
    max_restarts: int,
    failures: Sequence[Failure],
    stopping: bool = False,
    requeue: Requeues = NO_REQUEUES,
) -> Decision:
    """Restart or not after the last of `failures` (every attempt's of this run, in order,
    one each); `requeue`: the Slurm runs before this one, and --max-requeues.

    `stopping`: the job was interrupted or preempted while this attempt ended: nothing
    restarts, and where a restart was due the interrupt is the job's cause (INTERRUPTED).
    The reasons not to restart are checked only while restarts (or requeues) are left: each
    ends the job early.
    """
    failure = failures[-1]
    done = len(failures) - 1  # restarts made so far
    if stopping:
        if not decide(policy, max_restarts, failures, requeue=requeue).restart:
            return Decision(Verdict.STOPPING)
        return Decision(
            Verdict.INTERRUPTED,
            f"gpulaunch: {failure.what}; not restarting: the job was interrupted while "
            "its ranks stopped",
        )
    spent = done >= max_restarts  # (none allowed, or all made)
    if spent and not requeue.left:  # nothing to say but the report's
        return Decision(Verdict.SPENT)
    not_restarted = f"gpulaunch: {failure.what}; not restarting"
    if policy.says_do_not_restart(failure.kind, failure.status):
        return Decision(
            Verdict.NO_RESTART_CODE,
            f"{not_restarted}: exit {failure.status} says do not restart (--no-restart-exit-code)",
        )
    if not policy.restarts(failure.kind):
        return Decision(
            Verdict.NOT_RESTARTED,
            f"{not_restarted}: {failure.kind} is not in --restart-on "
            f"({','.join(sorted(policy.restart_on)) or 'none'})",
        )
    earlier = earlier_failures(requeue)
    loop = crash_loop_length(policy, [*earlier, *failures])
    if policy.crash_loop and loop >= policy.crash_loop:
        before = max(0, loop - len(failures))
        runs = f" ({before} of them in earlier Slurm runs of the job)" if before else ""
        return Decision(
            Verdict.CRASH_LOOP,
            f"{not_restarted}: a crash loop: {loop} attempts in a row failed this way{runs}, "
            f"none of them after {policy.progress_after:g} s (--crash-loop "
            f"{policy.crash_loop}, --progress-after {policy.progress_after:g})",
        )
    if spent:
        return Decision(Verdict.REQUEUE, requeue.line(failure.what, max_restarts))
    return Decision(
        Verdict.RESTART,
        f"gpulaunch: {failure.what}; restarting all ranks (restart {done + 1} of {max_restarts})",
    )
