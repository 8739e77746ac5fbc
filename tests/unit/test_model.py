"""The exit-status rules (README, "Exit status"), as a table."""

from __future__ import annotations

import pytest

from gpulaunch.model import Cause, RankExit, RankState, check_transition, job_outcome


def ok(t: float) -> RankExit:
    return RankExit(code=0, signal=None, stopped_by_watcher=False, observed_at=t, runtime=t)


def code(c: int, t: float, stopped: bool = False) -> RankExit:
    return RankExit(code=c, signal=None, stopped_by_watcher=stopped, observed_at=t, runtime=t)


def sig(s: int, t: float, stopped: bool = False) -> RankExit:
    return RankExit(code=None, signal=s, stopped_by_watcher=stopped, observed_at=t, runtime=t)


CASES = [
    # (exits by rank, interrupt, status, cause, cause rank)
    ({0: ok(1), 1: ok(2)}, None, 0, Cause.SUCCEEDED, None),
    ({0: ok(1), 1: code(7, 2), 2: sig(15, 3, stopped=True)}, None, 7, Cause.RANK_FAILED, 1),
    ({0: sig(9, 1), 1: sig(15, 2, stopped=True)}, None, 137, Cause.RANK_FAILED, 0),
    # the first observed failure wins, whatever the rank number
    ({0: code(3, 5), 1: code(4, 2)}, None, 4, Cause.RANK_FAILED, 1),
    # ranks the watcher stopped are never causes, even with odd statuses
    ({0: code(1, 1, stopped=True), 1: ok(0.5)}, None, 0, Cause.SUCCEEDED, None),
    # an early exit 0 is not a failure
    ({0: ok(0.1), 1: code(2, 9)}, None, 2, Cause.RANK_FAILED, 1),
    # interrupted: 128+N, unless a rank failed before the signal
    ({0: sig(15, 3, stopped=True)}, (2.0, 2), 130, Cause.INTERRUPTED, None),
    ({0: sig(15, 3, stopped=True)}, (2.0, 15), 143, Cause.INTERRUPTED, None),
    ({0: sig(15, 3, stopped=True)}, (2.0, 1), 129, Cause.INTERRUPTED, None),
    ({0: code(5, 1)}, (2.0, 2), 5, Cause.RANK_FAILED, 0),
    ({0: code(5, 3)}, (2.0, 2), 130, Cause.INTERRUPTED, None),
    ({}, (1.0, 15), 143, Cause.INTERRUPTED, None),
    # a signal with core dump still counts as 128+N
    ({0: RankExit(None, 11, False, 1, 1, core_dumped=True)}, None, 139, Cause.RANK_FAILED, 0),
]


@pytest.mark.parametrize(("exits", "interrupt", "status", "cause", "cause_rank"), CASES)
def test_job_outcome(exits, interrupt, status, cause, cause_rank) -> None:  # type: ignore[no-untyped-def]
    outcome = job_outcome(exits, interrupt)
    assert (outcome.status, outcome.cause, outcome.cause_rank) == (status, cause, cause_rank)


def test_describe() -> None:
    assert code(7, 0).describe() == "exit 7"
    assert sig(9, 0).describe() == "SIGKILL"
    assert RankExit(None, 11, False, 0, 0, core_dumped=True).describe() == "SIGSEGV (core dumped)"


@pytest.mark.parametrize(
    ("old", "new", "legal"),
    [
        (RankState.PENDING, RankState.HELD, True),
        (RankState.HELD, RankState.RUNNING, True),
        (RankState.HELD, RankState.STOPPED, True),
        (RankState.RUNNING, RankState.EXITED, True),
        (RankState.PENDING, RankState.RUNNING, False),
        (RankState.EXITED, RankState.RUNNING, False),
        (RankState.STOPPED, RankState.EXITED, False),
    ],
)
def test_transitions(old: RankState, new: RankState, legal: bool) -> None:
    if legal:
        check_transition(old, new)
    else:
        with pytest.raises(RuntimeError):
            check_transition(old, new)
