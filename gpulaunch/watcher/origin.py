"""Which rank a failure began in, when the first rank to end was only taken down by it.

A rank whose collective partner goes away fails with its transport's "the peer is
gone" (gloo: "Connection closed by peer"; NCCL: "remote process exited or there was
a network error"; a store: "Connection was likely closed"), and often ends before
the rank that went away: Python prints an uncaught exception's traceback first and
only then tears down (torch, CUDA: a second or more), and it is that teardown which
closes the connections. Seen in CI: rank 1 aborted on "Connection closed by peer"
20 ms before rank 2, whose traceback it was, had ended.

So when the first rank to fail says no more than that a peer went away, a rank still
running that has printed a traceback of its own since it started, one that does not
say so, is most likely tearing down from the true cause: its failure counts from its
traceback (`Rank.error_at`, as for an @record error file, watcher/errorwatch.py), and
it gets the grace to end by itself. If it does not fail, nothing changed: the gang is
stopped after the grace and the first rank is the cause. One node only, as for error
files: each node names the same cause from the first failure it hears of.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from gpulaunch.watcher.ranks import Rank

PEER_GONE = re.compile(
    r"Connection (?:closed|reset) by peer"  # gloo's pairs
    r"|remote process exited or there was a network error"  # NCCL (ncclRemoteError)
    r"|NCCL communicator was aborted"
    r"|Connection was likely closed"  # c10d's TCPStore: the store's host went away
)


def peer_gone(stderr_tail: str) -> bool:
    """Whether a rank's last stderr lines say that it failed because a peer went away."""
    return PEER_GONE.search(stderr_tail) is not None


def blame_teardown(
    failed: Rank,
    ranks: Sequence[Rank],
    stderr_tail: Callable[[int], str],
    raised_at: Callable[[int], float | None],
) -> Rank | None:
    """`failed` just failed by itself: if it only lost a peer, the running rank whose own
    traceback came first gets its failure dated from it (`error_at`); that rank, or None."""
    if failed.exit is None or not peer_gone(stderr_tail(failed.spec.rank)):
        return None
    suspects = []
    for rank in ranks:
        at = raised_at(rank.spec.rank)
        if (
            rank is not failed
            and rank.state.alive
            and not rank.stop_requested
            and rank.error_at is None
            and at is not None
            and rank.born_at <= at <= failed.exit.observed_at
            and not peer_gone(stderr_tail(rank.spec.rank))
        ):
            suspects.append((at, rank.spec.rank, rank))
    if not suspects:
        return None
    at, _, origin = min(suspects)
    origin.error_at = at
    return origin
