"""What a node's watcher knows of the other nodes of its job, through its peer.

The watcher offers this node's first failure, learns the job's first failure
(whichever node had it: the store decides, gpulaunch/multinode/peer.py), and at its end
passes the exit barrier. Everything runs on the watcher's loop: `attach` hands
it the peer's socket and pidfd.
"""

from __future__ import annotations

from collections.abc import Callable

from gpulaunch.base.protocol import NODE_LOST_STATUS, Event, Layout, NodeFailure, RoundEnd
from gpulaunch.model import signal_name
from gpulaunch.multinode.peerlink import PeerLink
from gpulaunch.multinode.rounds import Next, after_failure
from gpulaunch.recovery.settings import RestartPolicy

ERROR_LINES_SHARED = 40  # of a failed rank's traceback, told to the other nodes


class OtherNodes:
    def __init__(
        self,
        peer: PeerLink,
        layout: Layout,
        clock: Callable[[], float],
        on_elsewhere: Callable[[NodeFailure], None],
    ) -> None:
        self.peer = peer
        self.layout = layout
        self.clock = clock
        self.on_elsewhere = on_elsewhere  # the job's first failure was another node's
        self.failure: NodeFailure | None = None  # the job's first failure, any node
        self.elsewhere_at: float | None = None  # when we learnt it was another node's
        self.done = False  # the peer passed the exit barrier, or it ended
        self._offered = False
        self._finishing = False
        self._unwatch: Callable[[int], object] = lambda fd: None
        self.ended: list[RoundEnd] = []  # the earlier rounds of a job that restarted
        self.next: Next | None = None  # what follows this round (after_round)

    def attach(
        self, watch: Callable[[int, Callable[[], None]], None], unwatch: Callable[[int], object]
    ) -> None:
        self._unwatch = unwatch
        watch(self.peer.fileno(), self._on_message)
        watch(self.peer.pidfd, self._on_exit)
        self._on_message()  # what came with the layout, if anything

    @property
    def elsewhere(self) -> tuple[float, int] | None:
        """(when, status) of another node's failure, for `job_outcome`."""
        if self.elsewhere_at is None or self.failure is None:
            return None
        return (self.elsewhere_at, self.failure.status)

    def offer(
        self,
        what: str,
        status: int,
        rank: int | None = None,
        error: str | None = None,
        error_source: str | None = None,
    ) -> None:
        """This node's first failure, as the job's cause if no other node's came first."""
        if self._offered:
            return
        self._offered = True
        if error is not None:
            error = "\n".join(error.splitlines()[-ERROR_LINES_SHARED:])
        me = self.layout.this_node
        self.peer.tell_failed(
            NodeFailure(
                node=me.node,
                host=me.host,
                status=status,
                what=what,
                rank=rank,
                error=error,
                error_source=error_source,
            )
        )

    def offer_interrupt(self, signum: int) -> None:
        self.offer(f"interrupted by {signal_name(signum)}", 128 + signum)

    def finish(self) -> bool:
        """Our ranks are done: through the exit barrier (once); True when it is passed."""
        if not self._finishing:
            self._finishing = True
            self.peer.tell_finish()
        return self.done

    def after_round(
        self, interrupted: bool, max_restarts: int, policy: RestartPolicy
    ) -> Next | None:
        """Once this node's ranks are all gone: what follows the round (None: this node's
        failure is on its way to the store and back; no failure: the end)."""
        if self.failure is None:
            self.next = None if self._offered else Next.END
        elif interrupted:  # this node was told to stop: it does not go on
            self.next = Next.END
        else:
            config = self.peer.config
            self.next = after_failure(self.failure, self.layout, config, max_restarts, policy)
        return self.next

    def next_round(self, wakeup_fd: int, why: Next) -> Layout:
        """Meet the other nodes again (blocks, as the first meeting does: no rank runs)."""
        assert self.failure is not None
        self.ended.append(RoundEnd(self.layout.attempt, self.failure))
        failures = self.layout.failures + (why is Next.RESTART)
        self.peer.tell_next_round(self.layout.attempt + 1, failures)
        self.layout = self.peer.join(wakeup_fd)
        self.failure = self.elsewhere_at = self.next = None
        self._offered = False
        self._on_message()  # what the peer said right after (the link is not readable again)
        return self.layout

    def _on_message(self) -> None:
        for kind, body in self.peer.receive():
            if kind == Event.CAUSE:
                self._on_cause(NodeFailure.from_dict(body["failure"]))
            elif kind == Event.ERROR:
                self._on_cause(_link_failure(body["message"]))
            elif kind == Event.FINISHED:
                self.done = True
        if self.peer.closed:
            self._unwatch(self.peer.fileno())

    def _on_exit(self) -> None:
        status = self.peer.reap()
        self._unwatch(self.peer.pidfd)
        self._on_message()  # what it said before it went
        if not self._finishing:
            self._on_cause(_link_failure(f"its process ended ({status.describe()})"))
        self.done = True

    def _on_cause(self, failure: NodeFailure) -> None:
        if self.failure is not None:
            return
        self.failure = failure
        if failure.node != self.layout.node_rank:
            self.elsewhere_at = self.clock()
            self.on_elsewhere(failure)


def _link_failure(why: str) -> NodeFailure:
    return NodeFailure(
        node=-1,
        host="",
        status=NODE_LOST_STATUS,
        what=f"this node lost its link to the other nodes: {why}",
    )
