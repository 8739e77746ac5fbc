"""The peer's own connections to the job's store (gpulaunch/multinode/peer.py).

A real TCPStore, served by a process of its own, reached through a door of ours:
a listener whose accept queue is full until we open it (node 0 on a loaded
machine, 32 nodes connecting at once: the kernel drops the SYNs and the client's
connect waits), which then forwards each connection to the store, and can cut
the ones it forwards while the store lives on. The peer runs in this process
with a socketpair as its link to the watcher, whose end the test reads.
"""

from __future__ import annotations

import datetime
import json
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from gpulaunch.base.protocol import (
    NODE_LOST_STATUS,
    Backend,
    Event,
    Layout,
    NodeConfig,
    NodeInfo,
    decode,
)
from gpulaunch.multinode.peer import STORE_SILENT_TIMEOUTS, Peer

pytestmark = pytest.mark.integration

HEARTBEAT_TIMEOUT = 0.5
SERVE = """
import time
from torch._C._distributed_c10d import TCPStore
store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
print(store.port, flush=True)
time.sleep(3600)
"""


@pytest.fixture
def store() -> Iterator[tuple[subprocess.Popen[str], int]]:
    """A job's store in a process of its own, and its port."""
    proc = subprocess.Popen([sys.executable, "-c", SERVE], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline())
        yield proc, port
    finally:
        proc.kill()
        proc.wait()


class Door:
    """A listener in front of the store: shut (its accept queue full) until `open`."""

    def __init__(self, store_port: int) -> None:
        self.store_port = store_port
        self.listener = socket.create_server(("127.0.0.1", 0), backlog=0)
        self.port = self.listener.getsockname()[1]
        self.forwarded: list[socket.socket] = []
        self._lock = threading.Lock()
        self.fillers = []  # never accepted before `open`: the queue is full, SYNs are dropped
        for _ in range(3):
            filler = socket.socket()
            filler.setblocking(False)
            filler.connect_ex(("127.0.0.1", self.port))
            self.fillers.append(filler)

    def open(self) -> None:
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.store_port))
            with self._lock:
                self.forwarded += [conn, upstream]
            for src, dst in ((conn, upstream), (upstream, conn)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        for sock in (src, dst):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def cut(self) -> None:
        """Break every connection forwarded so far (the store lives on, the door stays open)."""
        with self._lock:
            cut, self.forwarded = self.forwarded, []
        for sock in cut:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self) -> None:
        self.listener.close()
        self.cut()
        for filler in self.fillers:
            filler.close()


@pytest.fixture
def door(store: tuple[subprocess.Popen[str], int]) -> Iterator[Door]:
    shut = Door(store[1])
    try:
        yield shut
    finally:
        shut.close()


def peer_of(
    port: int, join_timeout: float = 30.0, node_rank: int = 1, nnodes: int = 2
) -> tuple[Peer, socket.socket]:
    """A node of the job, joined (its layout given), and the watcher's end of its link."""
    config = NodeConfig(
        backend=Backend.STATIC,
        endpoint=f"127.0.0.1:{port}",
        run_id="r1",
        nnodes=nnodes,
        nproc=1,
        job="j",
        node_rank=node_rank,
        rdzv_conf=(("join_timeout", str(join_timeout)),),
        heartbeat_interval=0.1,
        heartbeat_timeout=HEARTBEAT_TIMEOUT,
    )
    ours, theirs = socket.socketpair()
    peer = Peer(config, theirs)
    peer.layout = Layout(
        node_rank=node_rank,
        nnodes=nnodes,
        world_size=nnodes,
        master_addr="127.0.0.1",
        master_port=port,
        use_agent_store=False,
        run_id="r1",
        endpoint=config.endpoint,
        nodes=tuple(
            NodeInfo(node=n, host=f"127.0.0.{n + 1}", first_rank=n, nproc=1, pid=n + 1)
            for n in range(nnodes)
        ),
    )
    return peer, ours


def started(target: Any) -> threading.Thread:
    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread


def next_message(link: socket.socket, within: float) -> tuple[str, dict[str, Any]]:
    link.settimeout(within)
    data = b""
    while not data.endswith(b"\n"):
        chunk = link.recv(65536)
        assert chunk, "the peer closed its link without a word"
        data += chunk
    return decode(data.splitlines()[0])


def test_connection_waits_for_a_store_that_accepts_late(door: Door) -> None:
    """Connecting takes what joining may; each operation then keeps the short timeout."""
    peer, _ = peer_of(door.port)
    got: list[Any] = []
    failed: list[Exception] = []

    def connect() -> None:
        try:
            got.append(peer._store(timeout=HEARTBEAT_TIMEOUT))
        except Exception as exc:  # noqa: BLE001 - the defect: reported below
            failed.append(exc)

    thread = started(connect)
    time.sleep(4 * HEARTBEAT_TIMEOUT)  # longer than an operation may take
    door.open()
    thread.join(timeout=60)
    assert not failed, f"the connection gave up before the store answered: {failed[0]}"
    assert got, "no connection once the store answered"
    client = got[0]
    client.set("k", "v")
    assert client.get("k") == b"v"
    assert client.timeout == datetime.timedelta(seconds=HEARTBEAT_TIMEOUT)
    with pytest.raises(Exception, match="timeout"):
        client.wait(["never"])


def test_heartbeat_that_cannot_connect_is_reported(door: Door) -> None:
    """The defect of 32 nodes: a heartbeat thread that never connected died in silence."""
    peer, link = peer_of(door.port, join_timeout=1.0)
    heartbeat = started(peer.heartbeat)
    kind, body = next_message(link, within=60)
    assert kind == Event.ERROR
    assert "heartbeat" in body["message"] and f"127.0.0.1:{door.port}" in body["message"]
    heartbeat.join(timeout=60)
    assert not heartbeat.is_alive()


def test_heartbeat_that_stops_is_a_reported_node_failure(
    store: tuple[subprocess.Popen[str], int], door: Door
) -> None:
    """Its connection breaks mid-job: the watcher hears it, then the other nodes."""
    door.open()
    peer, link = peer_of(door.port)
    heartbeat = started(peer.heartbeat)
    others = peer_of(store[1])[0]._store(timeout=30.0)  # straight to the store
    others.wait(["hb/1"])  # it beats
    door.cut()
    kind, body = next_message(link, within=60)
    assert kind == Event.ERROR and "heartbeat" in body["message"]
    heartbeat.join(timeout=60)
    assert not heartbeat.is_alive()
    cause = json.loads(others.get("cause"))
    assert cause["node"] == 1 and cause["status"] == NODE_LOST_STATUS
    assert "heartbeat" in cause["what"]


def test_store_gone_is_told_by_the_cause_watch_not_the_heartbeat(
    store: tuple[subprocess.Popen[str], int],
) -> None:
    """Node 0 ended: the cause watch names it; the heartbeat adds nothing after it."""
    proc, port = store
    peer, link = peer_of(port, join_timeout=1.0)
    watch, heartbeat = started(peer.watch_cause), started(peer.heartbeat)
    peer._store(timeout=30.0).wait(["hb/1"])
    proc.kill()
    kind, body = next_message(link, within=60)
    assert kind == Event.CAUSE
    assert body["failure"]["node"] == 0 and "went away" in body["failure"]["what"]
    watch.join(timeout=60)
    heartbeat.join(timeout=60)
    link.settimeout(0.5)
    with pytest.raises(TimeoutError):
        link.recv(65536)


@pytest.mark.parametrize("finished", [False, True])
def test_node_0_finds_the_silent_node_among_many(
    store: tuple[subprocess.Popen[str], int], finished: bool
) -> None:
    """Node 0 reads every counter at once; a silent node is lost unless it finished."""
    proc, port = store
    nnodes = 50
    peer, _ = peer_of(port, node_rank=0, nnodes=nnodes)
    others = peer._store(timeout=30.0)
    for n in range(nnodes):  # what every node's rendezvous leaves
        others.add(f"hb/{n}", 0)
    if finished:
        others.set("done/7", "done")
    stop = threading.Event()

    def beat_but_7() -> None:
        while not stop.wait(0.05):
            for n in range(1, nnodes):
                if n != 7:
                    others.add(f"hb/{n}", 1)

    beating, heartbeat = started(beat_but_7), started(peer.heartbeat)
    # Found within an interval past the timeout; a finished node is given 8 timeouts.
    deadline = time.monotonic() + (8 * HEARTBEAT_TIMEOUT if finished else 60)
    lost = False
    while time.monotonic() < deadline and not lost:
        lost = others.check(["cause"])
        time.sleep(0.05)
    stop.set()
    beating.join(timeout=30)
    if finished:
        assert not lost, others.get("cause")
    else:
        cause = json.loads(others.get("cause"))
        assert cause["node"] == 7 and cause["status"] == NODE_LOST_STATUS
        assert "no heartbeat" in cause["what"]
        assert others.get("done/7") == b"lost"
        assert not others.check(["done/8"])  # the beating ones stay watched
    peer.finishing.set()
    proc.kill()
    heartbeat.join(timeout=30)
    assert not heartbeat.is_alive()


SERVE_MANY = """
import resource, time
resource.setrlimit(resource.RLIMIT_NOFILE, (64, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
from gpulaunch.multinode.rendezvous import take_hard_nofile
take_hard_nofile()
from torch._C._distributed_c10d import TCPStore
store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
print(store.port, flush=True)
time.sleep(3600)
"""
CONNECT_MANY = """
import datetime, sys
from torch._C._distributed_c10d import TCPStore
clients = [
    TCPStore("127.0.0.1", int(sys.argv[1]), is_master=False, wait_for_workers=False,
             timeout=datetime.timedelta(seconds=30))
    for _ in range(int(sys.argv[2]))
]
for n, client in enumerate(clients):
    client.set(f"k{n}", "v")
print(len(clients), flush=True)
"""


def test_the_store_a_peer_serves_takes_connections_beyond_the_users_fd_limit() -> None:
    """Node 0's store holds 4 connections per node and one per rank: a soft limit of 64
    (1024 in real life) must not cap the job at a few nodes."""
    server = subprocess.Popen([sys.executable, "-c", SERVE_MANY], stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        port = server.stdout.readline().strip()
        assert port, "the store did not start"
        clients = subprocess.run(
            [sys.executable, "-c", CONNECT_MANY, port, "150"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert clients.returncode == 0, clients.stderr[-2000:]
        assert clients.stdout.strip() == "150"
    finally:
        server.kill()
        server.wait()


def test_heartbeat_outlives_an_answer_later_than_its_timeout(
    store: tuple[subprocess.Popen[str], int],
) -> None:
    """A slow store is no lost node: node 0 waits past its timeout for node 1's counter
    (not there yet), takes a new connection, and goes on watching."""
    proc, port = store
    peer, link = peer_of(port, node_rank=0)
    others = peer._store(timeout=30.0)
    heartbeat = started(peer.heartbeat)
    others.wait(["hb/0"])
    first = int(others.get("hb/0"))
    time.sleep(6 * HEARTBEAT_TIMEOUT)  # several answers later than the timeout
    link.settimeout(0.1)
    with pytest.raises(TimeoutError):
        link.recv(65536)  # nothing to tell the watcher
    assert heartbeat.is_alive()
    assert int(others.get("hb/0")) > first  # it kept beating
    others.add("hb/1", 0)  # node 1 appears, then stays silent
    deadline = time.monotonic() + 60
    while not others.check(["cause"]) and time.monotonic() < deadline:
        time.sleep(0.05)
    cause = json.loads(others.get("cause"))
    assert cause["node"] == 1 and "no heartbeat" in cause["what"]
    peer.finishing.set()
    proc.kill()
    heartbeat.join(timeout=30)
    assert not heartbeat.is_alive()


@pytest.mark.parametrize("at_barrier", [False, True], ids=["running", "at-the-barrier"])
def test_a_store_that_stops_answering_is_its_node_lost(
    store: tuple[subprocess.Popen[str], int], at_barrier: bool
) -> None:
    """Node 0 lost without closing its sockets (power, a partition: here SIGSTOP): torch's
    calls on it wait without bound, so the heartbeat's watchdog tells the watcher that the
    store's node is lost (not at the exit barrier: the ranks' outcome stands), then that
    the barrier is passed. Before the watchdog the peer waited for ever."""
    import torch.distributed  # noqa: F401 - as the peer's rendezvous did, not in 3 threads at once

    proc, port = store
    peer, link = peer_of(port)
    peer.start_round()
    deadline = time.monotonic() + 60
    while peer._answered_at is None and time.monotonic() < deadline:  # it beats: answered
        time.sleep(0.05)
    if at_barrier:
        peer.finishing.set()
    stopped = time.monotonic()
    proc.send_signal(signal.SIGSTOP)
    messages: list[tuple[str, dict[str, Any]]] = []
    try:
        link.settimeout(60)
        data = b""
        while not messages or messages[-1][0] != Event.FINISHED:
            chunk = link.recv(65536)
            assert chunk, f"the peer closed its link after {messages}"
            data += chunk
            *lines, data = data.split(b"\n")
            messages += [decode(line) for line in lines]
        took = time.monotonic() - stopped
    finally:
        proc.send_signal(signal.SIGCONT)
    answered = peer._answered_at  # its last answer, just before the SIGSTOP
    assert (
        answered is not None
        and stopped + took - answered > STORE_SILENT_TIMEOUTS * HEARTBEAT_TIMEOUT
    )
    if not at_barrier:
        kind, body = messages[0]
        assert kind == Event.CAUSE, messages
        failure = body["failure"]
        assert failure["node"] == 0 and failure["status"] == NODE_LOST_STATUS
        assert f"store at 127.0.0.1:{port} has not answered for" in failure["what"]
    assert messages[-1][0] == Event.FINISHED, messages
    print(f"store silent -> the watcher told: {took:.2f} s")
