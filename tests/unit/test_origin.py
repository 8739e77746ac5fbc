"""Which rank a failure began in when the first to end only lost a peer (watcher/origin.py)."""

from __future__ import annotations

from gpulaunch.base.procs import WaitStatus
from gpulaunch.logs.output import Stream
from gpulaunch.model import RankExit, RankSpec, RankState, job_outcome
from gpulaunch.watcher.origin import blame_teardown, peer_gone
from gpulaunch.watcher.ranks import Rank
from tests.unit.fakes import make

GLOO = (
    "[rank1]: RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection "
    "closed by peer [127.0.1.1]:5550. This is typically caused by a remote worker crashing.\n"
    "terminate called without an active exception"
)
OWN = "[rank2]: Traceback (most recent call last):\n[rank2]: RuntimeError: rank 2 failed on purpose"


def exited(rank: Rank, at: float, signal: int | None = 6) -> Rank:
    rank.state = RankState.EXITED
    rank.exit = RankExit(
        code=None if signal else 1, signal=signal, stopped_by_watcher=False,
        observed_at=at, runtime=at - rank.born_at,
    )  # fmt: skip
    return rank


def gang(n: int = 3) -> list[Rank]:
    ranks = [Rank(spec=RankSpec(i, i, f"u{i}", (), {}), born_at=1.0) for i in range(n)]
    for rank in ranks:
        rank.state = RankState.RUNNING
    return ranks


def test_peer_gone_knows_gloo_nccl_and_the_store() -> None:
    assert peer_gone(GLOO)
    assert peer_gone("NCCL error: remote process exited or there was a network error")
    store = "DistNetworkError: Failed to recv, got 0 bytes. Connection was likely closed."
    assert peer_gone(store)
    assert not peer_gone(OWN)
    assert not peer_gone("")


def test_a_rank_that_only_lost_a_peer_yields_to_the_one_that_raised_first() -> None:
    ranks = gang()
    tails = {1: GLOO, 2: OWN, 0: ""}
    raised = {2: 5.0, 1: 5.1}
    exited(ranks[1], at=5.2)
    origin = blame_teardown(ranks[1], ranks, tails.__getitem__, raised.get)
    assert origin is ranks[2] and ranks[2].error_at == 5.0
    # rank 2 then ends by itself (exit 1): it is the cause, not rank 1's earlier abort
    ranks[2].exit = ranks[2].ended(WaitStatus(1, None, False), 6.0, None, None)  # type: ignore[arg-type]
    outcome = job_outcome({1: ranks[1].exit, 2: ranks[2].exit})
    assert outcome.cause_rank == 2 and outcome.status == 1


def test_nobody_else_is_blamed_when_the_first_failure_is_its_own() -> None:
    ranks = gang()
    exited(ranks[1], at=5.2, signal=None)
    tails = {1: OWN, 2: OWN, 0: ""}
    assert blame_teardown(ranks[1], ranks, tails.__getitem__, {2: 5.0}.get) is None
    assert ranks[2].error_at is None


def test_only_a_traceback_of_this_attempt_before_the_failure_and_not_a_peer_s_counts() -> None:
    ranks = gang(4)
    exited(ranks[1], at=5.2)
    tails = {0: OWN, 1: GLOO, 2: GLOO, 3: OWN}
    # rank 0: its traceback is from before this attempt; rank 2: lost a peer too;
    # rank 3: its traceback came after rank 1 ended
    raised = {0: 0.5, 2: 5.0, 3: 5.3}
    assert blame_teardown(ranks[1], ranks, tails.__getitem__, raised.get) is None
    ranks[3].stop_requested = True  # and a rank the watcher stops is never the origin
    assert blame_teardown(ranks[1], ranks, tails.__getitem__, {3: 5.0}.get) is None


def test_the_earliest_traceback_wins() -> None:
    ranks = gang(4)
    exited(ranks[0], at=9.0)
    tails = {0: GLOO, 1: OWN, 2: OWN, 3: OWN}
    origin = blame_teardown(ranks[0], ranks, tails.__getitem__, {1: 4.0, 2: 3.0, 3: 8.0}.get)
    assert origin is ranks[2] and ranks[2].error_at == 3.0


def test_output_notes_when_a_rank_began_a_traceback_on_stderr() -> None:
    o, _, _ = make()
    assert o.raised_at(1) is None
    o.data(1, Stream.STDOUT, b"Traceback (most recent call last):\n")  # stdout: not an error
    assert o.raised_at(1) is None
    o.data(1, Stream.STDERR, b"[rank1]: Traceback (most recent call last):\n[rank1]:   File")
    first = o.raised_at(1)
    assert first is not None and o.raised_at(0) is None
    o.data(1, Stream.STDERR, b' "x.py", line 1\nTraceback (most recent call last):\n')
    second = o.raised_at(1)
    assert second is not None and second >= first  # the latest one
