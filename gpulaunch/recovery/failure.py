"""What failed in an attempt: its class, status and name, from the exit-status rules' outcome."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from gpulaunch.model import Cause, Outcome, RankExit
from gpulaunch.recovery.classes import FailureClass


@dataclass(frozen=True)
class Failure:
    """One failed attempt: its class, the job's status for it, and what to call it."""

    kind: FailureClass
    status: int
    what: str  # "rank 1 exit 4", "the job hung (--hang-timeout)"
    runtime: float  # seconds the attempt ran before it failed (see progress.py)
    rank: int | None = None
    stepped: bool = False  # a rank reported a training step in it (gpulaunch/progress/)

    @property
    def signature(self) -> tuple[FailureClass, int]:
        """Two failures with the same signature failed "the same way" (a crash loop)."""
        return (self.kind, self.status)


def rank_class(exit: RankExit) -> FailureClass:
    """The class of a failed rank's exit."""
    if exit.oom is not None:
        return FailureClass.OOM
    if exit.signal is not None:
        return FailureClass.SIGNAL
    return FailureClass.EXIT


def status_class(status: int) -> FailureClass:
    """The class of a rank's failure known only by its job status: another node's rank,
    through the rendezvous store (multinode/rounds.py). A death by signal N is 128+N; an
    OOM kill reads as SIGKILL there (the rank's own node classifies it by `rank_class`)."""
    return FailureClass.SIGNAL if status > 128 else FailureClass.EXIT


def classify(outcome: Outcome, exits: Mapping[int, RankExit]) -> Failure | None:
    """The attempt's failure, or None where it did not fail (succeeded, was interrupted or
    preempted, could not start): only failures are restarted."""
    runtime = max((e.runtime for e in exits.values()), default=0.0)
    if outcome.cause is Cause.RANK_FAILED and outcome.cause_rank is not None:
        exit = exits[outcome.cause_rank]
        return Failure(
            rank_class(exit),
            outcome.status,
            f"rank {outcome.cause_rank} {exit.describe()}",
            exit.runtime,
            outcome.cause_rank,
        )
    if outcome.cause is Cause.HUNG:
        return Failure(FailureClass.HANG, outcome.status, "the job hung (--hang-timeout)", runtime)
    if outcome.cause is Cause.NODE_FAILED:
        what = f"another node failed (status {outcome.status})"
        return Failure(FailureClass.NODE, outcome.status, what, runtime)
    return None
