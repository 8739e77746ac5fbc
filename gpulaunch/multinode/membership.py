"""gpulaunch's own rendezvous (`--rdzv-backend gpulaunch`): who is in the next round.

torch's c10d rendezvous keeps a vanished node in its round until the node's keep-alive
expires (5 s x 3) and then waits `last_call_timeout` for late nodes. This handler, a
`RendezvousHandler` registered with torch's `rendezvous_handler_registry` under the
name `gpulaunch` and run by the peer (peer.py), decides on the same kind of store
(torch's TCPStore at the endpoint, served by the node that binds it, as c10d) from the
nodes' own heartbeats instead:

- every node beats its counter (`beat/<id>`) every `interval` for as long as it runs;
- the node serving the store (the *decider*) reads every node's counter at each beat;
  a node whose counter stood still for `silent` is not alive (nor is one that left:
  its counter is made negative);
- a node that wants a round adds itself to the open round's join list and waits
  (one blocking `wait`) for that round's `members`;
- the decider closes the open round (`compare_set` of its `members`) as soon as every
  node alive has joined it and at least MIN have (or MAX have). Only the job's first
  round also waits torch's `last_call_timeout` for late nodes once MIN are there, as
  c10d does: a node still starting is not yet known to be alive.

Members are numbered as torch's c10d numbers them (by address). A node that joined a
round too late (it closed, or MAX were there) waits in the next one: a spare.
Liveness is read on a timer, on purpose: silence is what it detects.
"""

from __future__ import annotations

import datetime
import json
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gpulaunch.plan.nodes import BEATS_PER_TIMEOUT, GPULAUNCH_NODE_TIMEOUT

BACKEND = "gpulaunch"
DEFAULT_NODE_TIMEOUT = GPULAUNCH_NODE_TIMEOUT  # --node-timeout: a silent node is out within it
LEFT = -(1 << 40)  # added to a counter: the node left (it is never alive again)
LAST_CALL_S = 30.0  # torch's default last_call_timeout (the first round only)
JOIN_TIMEOUT_S = 600.0  # torch's default join_timeout


@dataclass(frozen=True)
class Liveness:
    """How often a node beats, and after how long a silent one is lost.

    A node's last beat is seen at most one interval later, and judged at most one interval
    after that: declared lost at most `node_timeout` after its last heartbeat.
    """

    interval: float
    silent: float

    @classmethod
    def for_timeout(cls, node_timeout: float) -> Liveness:
        interval = node_timeout / BEATS_PER_TIMEOUT
        return cls(interval=interval, silent=node_timeout - 2 * interval)


def node_order(previous: list[str], joined: list[str], alive: set[str], most: int) -> list[str]:
    """The round's members in node-rank order: at most `most` of the nodes alive that joined
    (the last round's first, then in the order they joined), ordered by their ids, which
    begin with their addresses: the order torch's c10d gives them."""
    here = [n for n in dict.fromkeys(joined) if n in alive]
    chosen = [n for n in previous if n in here] + [n for n in here if n not in previous]
    return sorted(chosen[:most])


def can_close(
    joined: list[str], alive: set[str], min_nodes: int, max_nodes: int, last_call_over: bool
) -> bool:
    """Whether the open round closes now: MAX alive nodes joined, or at least MIN and every
    node alive (for the first round: once its last call is over)."""
    here = set(joined) & alive
    if len(here) >= max_nodes:
        return True
    return len(here) >= min_nodes and alive <= here and last_call_over


def connect(host: str, port: int, timeout: float) -> tuple[Any, bool]:
    """The store at the endpoint, served here if this machine can bind it (as c10d);
    whether this process serves it."""
    from torch._C._distributed_c10d import TCPStore

    delta = datetime.timedelta(seconds=timeout)
    try:
        store = TCPStore(host, port, is_master=True, multi_tenant=True, timeout=delta)
        return store, True
    except (ValueError, RuntimeError, TimeoutError):  # another node serves it
        pass
    return TCPStore(host, port, is_master=False, timeout=delta), False


class MembershipHandler:
    """torch's RendezvousHandler interface (made a subclass of it by `handler_class`)."""

    def __init__(
        self,
        run_id: str,
        endpoint: str,
        min_nodes: int,
        max_nodes: int,
        local_addr: str | None,
        node_timeout: float = DEFAULT_NODE_TIMEOUT,
        join_timeout: float = JOIN_TIMEOUT_S,
        last_call: float = LAST_CALL_S,
    ) -> None:
        host, port = endpoint.rsplit(":", 1)
        self._host, self._port = host.strip("[]"), int(port)
        self._run_id = run_id
        self.min_nodes, self.max_nodes = min_nodes, max_nodes
        self.addr = local_addr or socket.getfqdn()
        self.liveness = Liveness.for_timeout(node_timeout)
        self.join_timeout, self.last_call = join_timeout, last_call
        self.me = f"{self.addr}/{os.getpid()}/{uuid.uuid4().hex[:8]}"  # sorts by address
        self._server, self.serving = connect(self._host, self._port, join_timeout)
        self._store = self._connection()
        self._stop = threading.Event()
        self._ranks_store: Any = None
        self._asking: Any = None
        self._closed = False
        self.decided_at: float | None = None  # when this node's last round was closed (time())
        self._store.set(f"beat/{self.me}", "0")
        index = self._store.add("nodes", 1) - 1
        self._store.set(f"node/{index}", self.me)
        worker = self._decide if self.serving else self._beat_only
        threading.Thread(target=worker, name="membership", daemon=True).start()

    def _connection(self, timeout: float | None = None) -> Any:
        """A connection of this thread's own to the membership's keys: made with the join
        timeout (a loaded store may be slow to accept), then used with `timeout`."""
        from torch._C._distributed_c10d import PrefixStore, TCPStore

        store = TCPStore(
            self._host,
            self._port,
            is_master=False,
            wait_for_workers=False,
            timeout=datetime.timedelta(seconds=self.join_timeout),
        )
        if timeout is not None:
            store.set_timeout(datetime.timedelta(seconds=timeout))
        return PrefixStore(f"gpulaunch-rdzv/{self._run_id}/", store)

    # -- torch's RendezvousHandler ------------------------------------------

    def get_backend(self) -> str:
        return BACKEND

    @property
    def use_agent_store(self) -> bool:
        return True  # the ranks connect to the store that node rank 0 serves them

    def next_rendezvous(self) -> Any:
        from torch._C._distributed_c10d import PrefixStore, TCPStore
        from torch.distributed import DistStoreError
        from torch.distributed.elastic.rendezvous.api import (
            RendezvousInfo,
            RendezvousStoreInfo,
            RendezvousTimeoutError,
        )

        deadline = time.monotonic() + self.join_timeout
        store = self._store
        g = int(store.add("open", 0))
        while True:
            index = store.add(f"r{g}/n", 1) - 1
            store.set(f"r{g}/j{index}", self.me)
            left = deadline - time.monotonic()
            try:
                store.wait([f"r{g}/members"], datetime.timedelta(seconds=max(left, 0.001)))
            except DistStoreError:
                raise RendezvousTimeoutError(
                    f"no round of {self.min_nodes} nodes within {self.join_timeout:.0f} s"
                ) from None
            decided = json.loads(store.get(f"r{g}/members"))
            members: list[str] = decided["members"]
            if self.me in members:
                self.decided_at = float(decided["at"])
                break
            g = max(g + 1, int(store.add("open", 0)))  # a spare, or late: the next round
        rank = members.index(self.me)
        round_store = PrefixStore(f"gpulaunch-rdzv/{self._run_id}/r{g}/s/", self._server)
        port = 0
        if rank == 0:  # a fresh store for this round's ranks (nothing of the last world)
            self._ranks_store = None
            self._ranks_store = TCPStore(
                self.addr, 0, is_master=True, wait_for_workers=False, multi_tenant=True
            )
            port = self._ranks_store.port
        boot = RendezvousStoreInfo.build(rank, round_store, self.addr, port)
        return RendezvousInfo(round_store, rank, len(members), boot)

    def is_closed(self) -> bool:
        return self._closed

    def set_closed(self) -> None:
        self._closed = True

    def num_nodes_waiting(self) -> int:
        """Nodes in the open round (asked while a round runs: they wait to join); on a
        connection of its own (the peer asks from its heartbeat's thread)."""
        if self._asking is None:
            self._asking = self._connection(self.liveness.silent)
        g = int(self._asking.add("open", 0))
        return int(self._asking.add(f"r{g}/n", 0))

    def get_run_id(self) -> str:
        return self._run_id

    def shutdown(self) -> bool:
        """Leave: no round waits for this node from now on (its counter goes negative)."""
        if self._stop.is_set():
            return True
        self._stop.set()
        try:
            self._store.add(f"beat/{self.me}", LEFT)
        except Exception:  # noqa: BLE001 - the store is gone: nobody waits for us then
            return False
        return True

    # -- the heartbeat, and the decider -----------------------------------------

    def _beat_only(self) -> None:
        self._beating(lambda store: store.add(f"beat/{self.me}", 1))

    def _decide(self) -> None:
        """The node serving the store: beat, judge who is alive, close the open round."""
        seen: dict[str, tuple[int, float]] = {}  # node -> (its counter, when it last moved)
        nodes: list[str] = []
        state = [_Round()]

        def tick(store: Any) -> None:
            state[0] = self._tick(store, seen, nodes, state[0])

        self._beating(tick)

    def _beating(self, beat: Callable[[Any], None]) -> None:
        """`beat` every interval until shutdown; a slow or broken store costs a new
        connection, never the thread (the peer says when the store is gone)."""
        store = None
        while not self._stop.wait(self.liveness.interval):
            try:
                if store is None:
                    store = self._connection(self.liveness.silent)
                beat(store)
            except Exception:  # noqa: BLE001 - a slow answer: a new connection, next beat
                store = None

    def _tick(
        self, store: Any, seen: dict[str, tuple[int, float]], nodes: list[str], state: _Round
    ) -> _Round:
        """One beat: who is alive, who joined the open round; close it if it may."""
        store.add(f"beat/{self.me}", 1)
        count = int(store.add("nodes", 0))
        if count > len(nodes):
            nodes += [store.get(f"node/{i}").decode() for i in range(len(nodes), count)]
        now = time.monotonic()
        counts = store.multi_get([f"beat/{n}" for n in nodes])
        alive = set()
        for n, raw in zip(nodes, counts, strict=True):
            beats, last = int(raw), seen.get(n)
            if last is None or last[0] != beats:
                seen[n] = last = (beats, now)
            if beats >= 0 and now - last[1] <= self.liveness.silent:
                alive.add(n)
        g = int(store.add("open", 0))
        if g != state.number:  # (closed by us: the round after, whose last call is none)
            state = _Round(g, state.previous)
        joins = int(store.add(f"r{g}/n", 0))
        while len(state.joined) < joins and store.check([f"r{g}/j{len(state.joined)}"]):
            state.joined.append(store.get(f"r{g}/j{len(state.joined)}").decode())
        here = set(state.joined) & alive
        if state.min_at is None and len(here) >= self.min_nodes:
            state.min_at = now
        first = state.number == 0
        over = not first or (state.min_at is not None and now - state.min_at >= self.last_call)
        if not can_close(state.joined, alive, self.min_nodes, self.max_nodes, over):
            return state
        members = node_order(state.previous, state.joined, alive, self.max_nodes)
        decided = json.dumps({"members": members, "at": time.time()})
        if store.compare_set(f"r{g}/members", "", decided) == decided.encode():
            store.add("open", 1)  # (only by whoever closed it: one decider per store)
        return _Round(g + 1, members)


@dataclass
class _Round:
    """The decider's view of the open round."""

    number: int = -1
    previous: list[str] = field(default_factory=list)  # the last round's members, in order
    joined: list[str] = field(default_factory=list)
    min_at: float | None = None  # when MIN alive nodes had joined (the first round's last call)


def handler_class() -> type:
    """MembershipHandler as a subclass of torch's RendezvousHandler (torch imported late)."""
    from torch.distributed.elastic.rendezvous.api import RendezvousHandler

    return type("GpulaunchRendezvousHandler", (MembershipHandler, RendezvousHandler), {})


def create_handler(params: Any) -> Any:
    """torch's registry's creator: `--rdzv-backend gpulaunch` (conf: node_timeout=S)."""
    cls = handler_class()
    return cls(
        run_id=params.run_id,
        endpoint=params.endpoint,
        min_nodes=params.min_nodes,
        max_nodes=params.max_nodes,
        local_addr=params.local_addr,
        node_timeout=float(params.get("node_timeout", DEFAULT_NODE_TIMEOUT)),
        join_timeout=float(params.get("join_timeout", JOIN_TIMEOUT_S)),
        last_call=float(params.get("last_call_timeout", LAST_CALL_S)),
    )


def register() -> None:
    """Make `gpulaunch` a backend of torch's rendezvous registry (once)."""
    from torch.distributed.elastic.rendezvous import rendezvous_handler_registry

    try:
        rendezvous_handler_registry.register(BACKEND, create_handler)
    except ValueError:  # registered already
        pass
