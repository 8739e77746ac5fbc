"""A node's place in a multi-node job, and what the nodes tell each other.

Pure data: the peer process (gpulaunch/multinode/peer.py) fills it in through torch's
rendezvous and store; the watcher (gpulaunch/multinode/peerlink.py) reads it. Both ends
exchange these as JSON lines.
"""

from __future__ import annotations

import enum
import json
from dataclasses import asdict, dataclass, field
from typing import Any

# How often a peer bumps its heartbeat counter in the store, and how long a
# counter may stand still before its node counts as lost (docs/multinode.md).
HEARTBEAT_INTERVAL = 1.0
HEARTBEAT_TIMEOUT = 5.0
# A node that was lost, not one of whose ranks failed: its status (sysexits' EX_TEMPFAIL).
NODE_LOST_STATUS = 75
# The `node` of a round's cause that is no node's failure: another node waits to join
# (--nnodes MIN:MAX), so every node meets again to take it in.
JOINING_NODE = -2


class Backend(enum.StrEnum):
    """torchrun's --rdzv-backend values that gpulaunch takes."""

    STATIC = "static"  # --nnodes N --node-rank R --master-addr --master-port
    C10D = "c10d"  # node ranks assigned by torch's dynamic rendezvous
    # gpulaunch's own, on torch's store: a lost node is out within --node-timeout
    # (gpulaunch/multinode/membership.py)
    GPULAUNCH = "gpulaunch"

    @property
    def elastic(self) -> bool:
        """Node ranks assigned by the rendezvous, --nnodes MIN:MAX, nodes may come and go."""
        return self is not Backend.STATIC


@dataclass(frozen=True)
class NodeConfig:
    """How this node joins its job: what the peer needs to rendezvous."""

    backend: Backend
    endpoint: str  # HOST:PORT of the rendezvous store
    run_id: str
    nnodes: int
    nproc: int  # ranks on this node
    job: str
    node_rank: int | None = None  # static only: given, not assigned
    local_addr: str | None = None  # this node's address as other nodes reach it
    rdzv_conf: tuple[tuple[str, str], ...] = ()  # --rdzv-conf key=value pairs
    heartbeat_interval: float = HEARTBEAT_INTERVAL
    heartbeat_timeout: float = HEARTBEAT_TIMEOUT
    min_nodes: int | None = None  # --nnodes MIN:MAX (c10d): fewer than `nnodes` may go on
    node_timeout: float = HEARTBEAT_TIMEOUT + HEARTBEAT_INTERVAL  # --node-timeout
    membership_file: str = ""  # where the peer tells the ranks each round's membership

    @property
    def wanted(self) -> str:
        """How many nodes the job meets, in words: "4", or "2 to 4" (--nnodes 2:4)."""
        return f"{self.min_nodes} to {self.nnodes}" if self.min_nodes else str(self.nnodes)

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> NodeConfig:
        data = json.loads(text)
        data["backend"] = Backend(data["backend"])
        data["rdzv_conf"] = tuple(tuple(pair) for pair in data["rdzv_conf"])
        return cls(**data)


@dataclass(frozen=True)
class NodeInfo:
    """One node of the job, as it announced itself in the store."""

    node: int
    host: str
    first_rank: int
    nproc: int
    pid: int  # its watcher's


@dataclass(frozen=True)
class Layout:
    """The job's world as the rendezvous settled it, seen from this node."""

    node_rank: int
    nnodes: int
    world_size: int  # ranks of all nodes
    master_addr: str  # the ranks' store (MASTER_ADDR/MASTER_PORT)
    master_port: int
    use_agent_store: bool  # the ranks connect to a store the peers serve (torchrun's contract)
    run_id: str
    endpoint: str
    nodes: tuple[NodeInfo, ...] = field(default_factory=tuple)
    # This round's TORCHELASTIC_RESTART_COUNT, and how many of its restarts were failures
    # (--max-restarts), as the nodes agreed (a node that joins late learns them here).
    attempt: int = 0
    failures: int = 0
    membership_file: str = ""  # GPULAUNCH_MEMBERSHIP_FILE ("": none)

    @property
    def this_node(self) -> NodeInfo:
        return self.nodes[self.node_rank]

    @property
    def first_rank(self) -> int:
        return self.this_node.first_rank

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Layout:
        rest = {k: v for k, v in data.items() if k != "nodes"}
        return cls(**rest, nodes=tuple(NodeInfo(**n) for n in data["nodes"]))


@dataclass(frozen=True)
class NodeFailure:
    """The first failure of the job, as every node agrees on it (the store decides).

    `rank` is the global rank that failed, or None when the node itself ended
    the job: it was interrupted, or its watcher died, or it stopped answering.
    """

    node: int
    host: str
    status: int
    what: str  # "rank 3 exit 1", "interrupted by SIGTERM", "its watcher died", ...
    rank: int | None = None
    error: str | None = None  # the failed rank's traceback or last stderr lines
    error_source: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> NodeFailure:
        return cls(**data)

    def describe(self) -> str:
        if self.node < 0:  # the store went away and nobody knows which node served it
            return self.what
        return f"node {self.node} ({self.host}): {self.what}"


@dataclass(frozen=True)
class RoundEnd:
    """An attempt of a multi-node job that ended in a failure and was followed by another."""

    attempt: int  # its TORCHELASTIC_RESTART_COUNT
    cause: NodeFailure  # the round's first failure, any node

    def to_dict(self) -> dict[str, Any]:
        return {"attempt": self.attempt, **self.cause.to_dict()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RoundEnd:
        rest = {k: v for k, v in data.items() if k != "attempt"}
        return cls(attempt=data["attempt"], cause=NodeFailure.from_dict(rest))

    def describe(self) -> str:
        return f"attempt {self.attempt}: {self.cause.describe()} (status {self.cause.status})"


class Event(enum.StrEnum):
    """Peer -> watcher messages."""

    JOINED = "joined"  # layout: the rendezvous is complete
    CAUSE = "cause"  # failure: the job's first failure, from any node
    ERROR = "error"  # message: the peer cannot go on (then it exits)
    FINISHED = "finished"  # every node has finished (the exit barrier)


class Command(enum.StrEnum):
    """Watcher -> peer messages."""

    FAILED = "failed"  # failure: something on this node failed first (as far as we know)
    FINISH = "finish"  # our ranks are done: pass the exit barrier, then exit
    NEXT_ROUND = "next-round"  # attempt, failures: our ranks are stopped; meet the others again


def encode(kind: Event | Command, **body: Any) -> bytes:
    return (json.dumps({"type": kind.value, **body}) + "\n").encode()


def decode(line: bytes) -> tuple[str, dict[str, Any]]:
    data = json.loads(line)
    return data.pop("type"), data
