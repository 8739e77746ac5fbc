"""The node's link to the other nodes: `python -m gpulaunch.multinode.peer CONFIG PID`.

A process of its own, in the watcher's scope, so that the watcher never
imports torch and so that the watcher's death is news it can still tell: it
reads the watcher's commands from fd 3 and sees EOF when the watcher dies.

It joins the job through torch's own rendezvous (static or c10d, as torchrun
does), then keeps three things going, each on its own store connection:

- the *cause watch*: a blocking `wait` on the job's `cause` key, which the
  store answers the moment any node sets it (no polling); when the store
  itself goes away the wait fails at once and that is news too;
- the *heartbeat*: every HEARTBEAT_INTERVAL it bumps its counter; node 0
  checks everybody's counter and the others check node 0's, so a node that
  vanished without a word is declared lost within HEARTBEAT_TIMEOUT plus an
  interval;
- the heartbeat's *watchdog*: torch's store calls wait without bound for a
  server that stays silent (node 0 lost without closing its sockets: power, a
  partition), so a heartbeat that has had no answer for STORE_SILENT_TIMEOUTS
  heartbeat timeouts is the store's node lost, told to the watcher (never a hang);
- the *commands* from the watcher: a failure here (set `cause` if nobody did
  first: compare_set decides the job's first failure for every node), and at
  the end the exit barrier (every node's `done` key), so that a node that
  serves a store keeps it until every node is done with it.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from gpulaunch.base.interrupts import INTERRUPTS, NOTICES
from gpulaunch.base.protocol import (
    HEARTBEAT_TIMEOUT,
    NODE_LOST_STATUS,
    Backend,
    Command,
    Event,
    Layout,
    NodeConfig,
    NodeFailure,
    NodeInfo,
    decode,
    encode,
)
from gpulaunch.linux import set_parent_death_signal
from gpulaunch.multinode import roster
from gpulaunch.multinode.addresses import UnresolvableHost, check_endpoint, check_own_name
from gpulaunch.multinode.rendezvous import (
    joining,
    leave_rendezvous,
    round_prefix,
    share_bootstrap,
    take_hard_nofile,
)

LINK_FD = 3
FOREVER = datetime.timedelta(days=365)
STORE_SILENT_TIMEOUTS = 6  # no answer for this many heartbeat timeouts: the store is gone


def die_with_watcher(signum: int) -> None:
    """Until the job's units exist we are nobody's: die with the watcher (0: stop that)."""
    set_parent_death_signal(signum)


class Peer:
    def __init__(self, config: NodeConfig, link: socket.socket) -> None:
        self.config = config
        self.link = link
        self._send_lock = threading.Lock()
        self.finishing = threading.Event()
        self.layout: Layout | None = None
        self.host = config.local_addr or socket.getfqdn()
        self._handler: Any = None  # keeps torch's rendezvous (and any store it serves) alive
        self._cause_told = threading.Event()
        self.round = 0  # rendezvous so far: a thread of an older round ends (rounds, below)
        self._prefix = ""  # this round's keys in the job's store
        self._ranks_store: Any = None  # a restarted round's store for the ranks (node 0)
        self._answered_at: float | None = None  # the heartbeat's last answer (this round)
        self._decided_at: float | None = None  # when this round's membership was decided
        self._previous: Layout | None = None  # the last round's (the membership file's `left`)
        self._cause: NodeFailure | None = None  # the last round's first failure

    # -- talking to the watcher ------------------------------------------

    def send(self, kind: Event, **body: Any) -> None:
        with self._send_lock:
            try:
                self.link.sendall(encode(kind, **body))
            except OSError:
                pass  # the watcher is gone; the command loop sees EOF and says so

    # -- the store ---------------------------------------------------------

    @property
    def join_timeout(self) -> float:
        """How long the nodes may take to meet: torch's own join timeout (--rdzv-conf)."""
        conf = dict(self.config.rdzv_conf)
        return float(conf.get("join_timeout", conf.get("timeout", 600)))

    def _client(self, timeout: float) -> Any:
        """A connection of our own to the job's store; `timeout` bounds each operation.

        The connection itself may take as long as joining may: the node serving the
        store can be slow to accept (a loaded machine, many nodes connecting at once),
        and a peer that gave up on it after `timeout` would lose its heartbeat.
        """
        from torch._C._distributed_c10d import PrefixStore, TCPStore

        host, port = self.config.endpoint.rsplit(":", 1)
        store = TCPStore(
            host.strip("[]"),
            int(port),
            is_master=False,
            wait_for_workers=False,
            timeout=datetime.timedelta(seconds=max(timeout, self.join_timeout)),
        )
        store.set_timeout(datetime.timedelta(seconds=timeout))
        return PrefixStore(f"gpulaunch/{self.config.run_id}/", store)

    def _store(self, timeout: float) -> Any:
        """A connection to this round's keys of the job's store."""
        from torch._C._distributed_c10d import PrefixStore

        return PrefixStore(self._prefix, self._client(timeout))

    def rendezvous(self, attempt: int = 0, failures: int = 0) -> Layout:
        """Meet the other nodes (again, for a restart: torch's next round, as torchrun's
        agent does); `attempt`, `failures`: this node's count, the round takes the most."""
        from torch.distributed.elastic.rendezvous import RendezvousParameters
        from torch.distributed.elastic.rendezvous.registry import get_rendezvous_handler

        from gpulaunch.multinode.membership import register

        cfg = self.config
        conf: dict[str, Any] = dict(cfg.rdzv_conf)
        if cfg.backend is Backend.STATIC:
            conf["rank"] = cfg.node_rank
        if cfg.backend is Backend.GPULAUNCH:
            register()
            conf["node_timeout"] = cfg.node_timeout
        if self._handler is None:
            params = RendezvousParameters(
                backend=cfg.backend.value,
                endpoint=cfg.endpoint,
                run_id=cfg.run_id,
                min_nodes=cfg.min_nodes or cfg.nnodes,
                max_nodes=cfg.nnodes,
                local_addr=cfg.local_addr,
                **conf,
            )
            self._handler = get_rendezvous_handler(params)
        info = self._handler.next_rendezvous()
        self._decided_at = getattr(self._handler, "decided_at", None) or time.time()
        node_rank, nnodes = info.rank, info.world_size
        self.round += 1
        if node_rank == 0 and cfg.backend is Backend.C10D:
            share_bootstrap(info)
        self._prefix = round_prefix(cfg.backend, info, attempt)
        store = self._store(timeout=self.join_timeout)
        me = {"host": self.host, "nproc": cfg.nproc, "pid": os.getppid()}
        store.add(f"hb/{node_rank}", 0)  # before we announce: every node's counter exists
        store.set(f"node/{node_rank}", json.dumps({**me, "attempt": attempt, "failures": failures}))
        keys = [f"node/{n}" for n in range(nnodes)]
        store.wait(keys)
        nodes, first = [], 0
        for n, raw in enumerate(store.multi_get(keys)):
            data = json.loads(raw)
            attempt, failures = max(attempt, data["attempt"]), max(failures, data["failures"])
            nodes.append(
                NodeInfo(
                    node=n,
                    host=data["host"],
                    first_rank=first,
                    nproc=data["nproc"],
                    pid=data["pid"],
                )
            )
            first += data["nproc"]
        addr, port = info.bootstrap_store_info.master_addr, info.bootstrap_store_info.master_port
        if attempt > 0 and cfg.backend is not Backend.GPULAUNCH:
            # a fresh store for the ranks: no key of the last round's world (ours makes one
            # every round)
            addr, port = self._fresh_ranks_store(store, node_rank, addr)
        return Layout(
            node_rank=node_rank,
            nnodes=nnodes,
            world_size=first,
            master_addr=addr,
            master_port=port,
            use_agent_store=bool(self._handler.use_agent_store),
            run_id=cfg.run_id,
            endpoint=cfg.endpoint,
            nodes=tuple(nodes),
            attempt=attempt,
            failures=failures,
            membership_file=cfg.membership_file,
        )

    def _fresh_ranks_store(self, store: Any, node_rank: int, addr: str) -> tuple[str, int]:
        """Node 0 serves the ranks of a restarted round a new store; the others learn where."""
        from torch._C._distributed_c10d import TCPStore

        if node_rank == 0:
            self._ranks_store = None  # the last round's goes
            self._ranks_store = TCPStore(
                addr.strip("[]"), 0, is_master=True, wait_for_workers=False, multi_tenant=True
            )
            store.set("ranks_store", json.dumps([addr, self._ranks_store.port]))
        addr, port = json.loads(store.get("ranks_store"))
        return str(addr), int(port)

    def tell_ranks(self, state: str) -> None:
        """The membership file (roster.py): the round just decided, or its first failure."""
        path, layout = self.config.membership_file, self.layout
        if not path or layout is None:
            return
        cause = self._cause
        data = roster.membership(layout, self._previous, cause, state, self._decided_at)
        try:
            roster.write(path, data)
        except OSError as exc:
            self.send(Event.ERROR, message=f"cannot write the membership file {path}: {exc}")

    def joined(self, layout: Layout) -> None:
        """A round is decided: the ranks' file first, then the watcher (which starts them)."""
        self._previous, self.layout = self.layout, layout
        self.tell_ranks("running")
        self.send(Event.JOINED, layout=layout.to_dict())

    def publish(self, store: Any, failure: NodeFailure) -> None:
        """Make `failure` the job's cause unless another node's came first."""
        store.compare_set("cause", "", json.dumps(failure.to_dict()))

    # -- the three activities ---------------------------------------------

    def start_round(self) -> None:
        """The cause watch, the heartbeat and its watchdog of this round (they end with it)."""
        self._answered_at = None
        _thread(self.watch_cause, "cause-watch")
        _thread(self.heartbeat, "heartbeat")
        _thread(self.watch_store, "store-watchdog")

    def watch_cause(self) -> None:
        this_round = self.round
        try:
            store = self._store(timeout=self.join_timeout)  # slow is not gone
            store.wait(["cause"], FOREVER)
            failure = NodeFailure.from_dict(json.loads(store.get("cause")))
        except Exception:  # noqa: BLE001 - any store error means the store went away
            if self.finishing.is_set():
                return
            failure = self._store_lost()
        self.tell_cause(failure, this_round)

    def tell_cause(self, failure: NodeFailure, this_round: int) -> None:
        """The round's first failure, to the watcher, once (the watch or the barrier may)."""
        with self._send_lock:
            if self._cause_told.is_set() or this_round != self.round:
                return
            self._cause_told.set()
            self._cause = failure
        self.tell_ranks("ending")
        self.send(Event.CAUSE, failure=failure.to_dict())

    def watch_store(self) -> None:
        """The heartbeat's watchdog: a store that stopped answering ends the round here.

        Its first answer may take what joining may (connecting: 32 nodes at once). The
        watcher hears that the store's node is lost (not at the exit barrier: this node's
        ranks are done, and their outcome stands), then that the barrier is passed: a
        silent store holds none.
        """
        this_round, began = self.round, time.monotonic()
        # (not shortened by a short --node-timeout: the store's node is not the yet)
        bound = STORE_SILENT_TIMEOUTS * max(self.config.heartbeat_timeout, HEARTBEAT_TIMEOUT)
        while True:  # a timer, on purpose: silence is what it detects
            time.sleep(self.config.heartbeat_interval)
            if this_round != self.round or self._cause_told.is_set():
                return
            answered = self._answered_at
            since, limit = (
                (began, max(bound, self.join_timeout)) if answered is None else (answered, bound)
            )
            if time.monotonic() - since <= limit:
                continue
            if not self.finishing.is_set():
                silent = f"has not answered for {time.monotonic() - since:.0f} s"
                self.tell_cause(self._store_lost(silent), this_round)
            self.send(Event.FINISHED)
            return

    def _store_lost(self, how: str = "went away (the node serving it ended)") -> NodeFailure:
        assert self.layout is not None
        host, _ = self.config.endpoint.rsplit(":", 1)
        serving = 0 if self.config.backend is Backend.STATIC else None
        node = self.layout.nodes[serving] if serving is not None else None
        return NodeFailure(
            node=node.node if node else -1,
            host=node.host if node else host,
            status=NODE_LOST_STATUS,
            what=f"the job's store at {self.config.endpoint} {how}",
        )

    def heartbeat(self) -> None:
        """Beat until this round or the job ends; a heartbeat that stops is this node's
        failure, said.

        A slow store is no lost node: an answer later than the heartbeat timeout (node
        0 on a loaded machine) costs a new connection (the late answer would still come
        on the old one), not the job; silence is judged by the counters alone.
        """
        from torch.distributed import DistStoreError  # a timeout; the store gone is another

        assert self.layout is not None
        layout, cfg, this_round = self.layout, self.config, self.round
        me = layout.node_rank
        watched = [n for n in range(layout.nnodes) if n != me and (me == 0 or n == 0)]
        seen: dict[int, tuple[int, float]] = {}  # node -> (its counter, when it last moved)
        # node 0 of an elastic job with room for more: it asks torch for waiting nodes
        room = [me == 0 and cfg.min_nodes is not None and layout.nnodes < cfg.nnodes]
        connected = False
        try:
            while this_round == self.round:
                store = self._store(timeout=cfg.heartbeat_timeout)
                connected = True
                try:
                    self._beat(store, watched, seen, this_round, room)
                except DistStoreError:
                    continue
        except Exception as exc:  # noqa: BLE001 - whatever stopped it, the job must hear
            if this_round == self.round:
                self._heartbeat_stopped(connected, exc)

    def _beat(
        self,
        store: Any,
        watched: list[int],
        seen: dict[int, tuple[int, float]],
        this_round: int,
        room: list[bool],
    ) -> None:
        """Beat, and watch the others' beats, until the round ends (then return)."""
        assert self.layout is not None
        layout, cfg = self.layout, self.config
        me = layout.node_rank
        while True:  # a timer, on purpose: silence is what it detects
            time.sleep(cfg.heartbeat_interval)
            if this_round != self.round:
                return
            store.add(f"hb/{me}", 1)
            self._answered_at = time.monotonic()
            if room[0] and self._handler.num_nodes_waiting() > 0:  # as torchrun's agent
                room[0] = False
                self.publish(store, joining())
            if not watched:
                continue
            now = time.monotonic()
            # One round trip however many nodes node 0 watches (their counters exist
            # since the rendezvous); only a counter that stood still costs another.
            counts = store.multi_get([f"hb/{n}" for n in watched])
            self._answered_at = time.monotonic()
            for n, raw in zip(list(watched), counts, strict=True):
                count, last = int(raw), seen.get(n)
                if last is None or last[0] != count:
                    seen[n] = (count, now)
                elif now - last[1] > cfg.heartbeat_timeout:
                    watched.remove(n)
                    if not store.check([f"done/{n}"]):  # a node that finished beats no more
                        self._declare_lost(store, layout.nodes[n], now - last[1])

    def _heartbeat_stopped(self, connected: bool, exc: Exception) -> None:
        """Tell the watcher (it stops this node's ranks), then the other nodes if we can.

        Without it the others would only see this node fall silent, and this node
        would no longer see theirs. A store that went away is the cause watch's to
        say (it sees that at once, and knows which node served it): give it an interval.
        The others hear it through a new connection (one whose operation timed out may
        still get that answer), unless there never was one: then our silence tells them.
        """
        if self.finishing.is_set() or self._cause_told.wait(self.config.heartbeat_interval):
            return
        assert self.layout is not None
        why = f"{type(exc).__name__}: {exc}".splitlines()[0]
        what = f"its heartbeat to the job's store at {self.config.endpoint} stopped ({why})"
        self.send(Event.ERROR, message=what)
        if not connected:
            return
        me = self.layout.this_node
        failure = NodeFailure(node=me.node, host=me.host, status=NODE_LOST_STATUS, what=what)
        try:
            self.publish(self._store(timeout=self.config.heartbeat_timeout), failure)
        except Exception:  # noqa: BLE001 - then our silence tells them
            pass

    def _declare_lost(self, store: Any, node: NodeInfo, silent: float) -> None:
        self.publish(
            store,
            NodeFailure(
                node=node.node,
                host=node.host,
                status=NODE_LOST_STATUS,
                what=f"lost: no heartbeat for {silent:.1f} s",
            ),
        )
        store.set(f"done/{node.node}", "lost")  # nobody waits for it at the exit barrier

    def commands(self) -> int:
        """Serve the watcher until it says finish (0) or dies (1)."""
        assert self.layout is not None
        store = self._store(timeout=self.join_timeout)  # slow is not gone
        buffer = b""
        while True:
            chunk = self.link.recv(65536)
            me = self.layout.this_node
            if not chunk:
                self.publish(
                    store,
                    NodeFailure(
                        node=me.node, host=me.host, status=NODE_LOST_STATUS, what="its watcher died"
                    ),
                )
                store.set(f"done/{me.node}", "lost")
                leave_rendezvous(self._handler)
                return 1
            buffer += chunk
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                kind, body = decode(line)
                if kind == Command.FAILED:
                    self.publish(store, NodeFailure.from_dict(body["failure"]))
                elif kind == Command.FINISH:
                    self.finish(store)
                    return 0
                elif kind == Command.NEXT_ROUND:
                    store.set(f"done/{me.node}", "next")  # no node's exit barrier waits for us
                    layout = self.rendezvous(body["attempt"], body["failures"])
                    self._cause_told.clear()
                    self.joined(layout)
                    self._cause = None
                    self.start_round()
                    store = self._store(timeout=self.join_timeout)

    def finish(self, store: Any) -> None:
        """The exit barrier: set our `done`, wait for every node's; then say so."""
        assert self.layout is not None
        self.finishing.set()
        try:
            store.set(f"done/{self.layout.node_rank}", "done")
            store.wait([f"done/{n}" for n in range(self.layout.nnodes)], FOREVER)
            if store.check(["cause"]):  # make sure the watcher has it before it reports
                cause = NodeFailure.from_dict(json.loads(store.get("cause")))
                self.tell_cause(cause, self.round)
        except Exception:  # noqa: BLE001
            # The store went away: the node serving it passed the barrier (and so every
            # node did) or it died; either way there is nobody left to wait for.
            pass
        self.send(Event.FINISHED)


def _thread(target: Callable[[], None], name: str) -> None:
    threading.Thread(target=target, name=name, daemon=True).start()


def main() -> int:
    # The watcher handles the terminal's and systemd's signals and tells us what to do.
    for sig in INTERRUPTS | NOTICES:
        signal.signal(sig, signal.SIG_IGN)
    logging.getLogger("torch.distributed").setLevel(logging.ERROR)
    die_with_watcher(signal.SIGKILL)
    if os.getppid() != int(sys.argv[2]):  # it died before the line above
        return 1
    take_hard_nofile()
    config = NodeConfig.from_json(sys.argv[1])
    link = socket.socket(fileno=LINK_FD)
    peer = Peer(config, link)
    try:
        if config.backend.elastic and not config.local_addr:
            check_own_name(peer.host)
        check_endpoint(config.endpoint)
        layout = peer.rendezvous()
    except UnresolvableHost as exc:
        peer.send(Event.ERROR, message=str(exc))
        return 1
    except Exception as exc:  # noqa: BLE001 - said to the watcher, which tells the user
        peer.send(Event.ERROR, message=f"{type(exc).__name__}: {exc}".splitlines()[0])
        return 1
    peer.joined(layout)
    # From now on we share the watcher's scope, and its death is news we tell the others.
    die_with_watcher(0)
    peer.start_round()
    try:
        return peer.commands()
    except Exception as exc:  # noqa: BLE001 - the store went away under a command
        if not peer.finishing.is_set():
            peer.send(Event.ERROR, message=f"{type(exc).__name__}: {exc}".splitlines()[0])
        return 1
    finally:
        if config.backend is Backend.GPULAUNCH:
            leave_rendezvous(peer._handler)  # no round waits for this node's silence
        if config.membership_file:
            roster.remove(config.membership_file)


if __name__ == "__main__":
    status = main()
    if NodeConfig.from_json(sys.argv[1]).backend is not Backend.GPULAUNCH:
        # Through the interpreter's teardown, as ever: on the node that serves the store
        # it is also the time in which the others read the cause just published (its
        # watcher died); an exit at once made them see a silent store instead.
        sys.exit(status)
    # Not through the interpreter's teardown: a daemon thread still in a store call then
    # (a heartbeat, the membership's) aborts the process ("terminate called ...").
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
