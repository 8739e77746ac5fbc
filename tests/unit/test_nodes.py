"""What the nodes tell each other: the JSON codecs of base/protocol.py and the peer."""

from __future__ import annotations

import copy
import json

import pytest

from gpulaunch.base.protocol import (
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

NODES = (
    NodeInfo(node=0, host="node0.example", first_rank=0, nproc=2, pid=100),
    NodeInfo(node=1, host="node1.example", first_rank=2, nproc=4, pid=200),
    NodeInfo(node=2, host="fd00::3", first_rank=6, nproc=1, pid=300),
)

LAYOUT = Layout(
    node_rank=1,
    nnodes=3,
    world_size=7,
    master_addr="node0.example",
    master_port=29500,
    use_agent_store=True,
    run_id="exp1",
    endpoint="node0.example:29500",
    nodes=NODES,
)

CONFIGS = [
    NodeConfig(
        backend=Backend.STATIC,
        endpoint="node0:29500",
        run_id="j",
        nnodes=2,
        nproc=4,
        job="j",
        node_rank=1,
    ),
    NodeConfig(
        backend=Backend.C10D,
        endpoint="[fd00::1]:29400",
        run_id="exp1",
        nnodes=8,
        nproc=8,
        job="train_slurm4242.0",
        node_rank=None,
        local_addr="node3.example",
        rdzv_conf=(("join_timeout", "900"), ("last_call_timeout", "2")),
        heartbeat_interval=0.25,
        heartbeat_timeout=2.5,
    ),
]

FAILURES = [
    NodeFailure(node=1, host="node1", status=1, what="rank 3 exit 1", rank=3),
    NodeFailure(
        node=2,
        host="node2",
        status=139,
        what="rank 6 SIGSEGV (core dumped)",
        rank=6,
        error='Traceback (most recent call last):\n  File "t.py"\nValueError: "boom"\n',
        error_source="its error file (@record)",
    ),
    NodeFailure(node=0, host="node0", status=143, what="interrupted by SIGTERM"),
    NodeFailure(
        node=-1,
        host="node0:29500",
        status=75,
        what="the job's store at node0:29500 went away (the node serving it ended)",
    ),
]


@pytest.mark.parametrize("config", CONFIGS)
def test_node_config_json_round_trip(config: NodeConfig) -> None:
    text = config.to_json()
    assert "\n" not in text  # it travels as one argv element of the peer
    back = NodeConfig.from_json(text)
    assert back == config
    assert type(back.backend) is Backend
    assert all(type(pair) is tuple for pair in back.rdzv_conf)


def test_node_config_json_is_plain() -> None:
    data = json.loads(CONFIGS[1].to_json())
    assert data["backend"] == "c10d"
    assert data["rdzv_conf"] == [["join_timeout", "900"], ["last_call_timeout", "2"]]
    assert data["node_rank"] is None


def test_layout_round_trip_through_json() -> None:
    text = json.dumps(LAYOUT.to_dict())
    back = Layout.from_dict(json.loads(text))
    assert back == LAYOUT
    assert all(type(n) is NodeInfo for n in back.nodes)
    assert type(back.nodes) is tuple


def test_layout_of_no_nodes_round_trips() -> None:
    empty = Layout(0, 1, 2, "127.0.0.1", 1, False, "r", "127.0.0.1:1")
    assert Layout.from_dict(json.loads(json.dumps(empty.to_dict()))) == empty


def test_layout_from_dict_leaves_its_argument_alone() -> None:
    data = json.loads(json.dumps(LAYOUT.to_dict()))
    before = copy.deepcopy(data)
    Layout.from_dict(data)
    assert data == before


def test_layout_places_the_ranks() -> None:
    assert LAYOUT.this_node == NODES[1]
    assert LAYOUT.first_rank == 2


@pytest.mark.parametrize("failure", FAILURES)
def test_node_failure_round_trip_through_json(failure: NodeFailure) -> None:
    assert NodeFailure.from_dict(json.loads(json.dumps(failure.to_dict()))) == failure


@pytest.mark.parametrize(
    ("failure", "text"),
    [
        (FAILURES[0], "node 1 (node1): rank 3 exit 1"),
        (FAILURES[1], "node 2 (node2): rank 6 SIGSEGV (core dumped)"),
        (FAILURES[2], "node 0 (node0): interrupted by SIGTERM"),
        # nobody knows which node served the store: what happened, without a node
        (FAILURES[3], "the job's store at node0:29500 went away (the node serving it ended)"),
        (
            NodeFailure(node=-1, host="", status=75, what="this node lost its link"),
            "this node lost its link",
        ),
    ],
)
def test_node_failure_describe(failure: NodeFailure, text: str) -> None:
    assert failure.describe() == text
    assert "\n" not in failure.describe()


# -- the peer protocol -------------------------------------------------------------


def test_encode_is_one_json_line() -> None:
    line = encode(Event.CAUSE, failure=FAILURES[1].to_dict())
    assert line.endswith(b"\n") and line.count(b"\n") == 1  # the traceback's newlines escaped
    assert json.loads(line)["type"] == "cause"


@pytest.mark.parametrize(
    ("kind", "body"),
    [
        (Event.JOINED, {"layout": LAYOUT.to_dict()}),
        (Event.CAUSE, {"failure": FAILURES[1].to_dict()}),
        (Event.ERROR, {"message": "rendezvous timed out after 600s"}),
        (Event.FINISHED, {}),
        (Command.FAILED, {"failure": FAILURES[0].to_dict()}),
        (Command.FINISH, {}),
    ],
)
def test_encode_decode_round_trip(kind: Event | Command, body: dict[str, object]) -> None:
    got_kind, got_body = decode(encode(kind, **body))
    assert got_kind == kind.value and got_kind == kind
    assert got_body == json.loads(json.dumps(body))


def test_decode_then_rebuild() -> None:
    _, body = decode(encode(Event.JOINED, layout=LAYOUT.to_dict()))
    assert Layout.from_dict(body["layout"]) == LAYOUT
    _, body = decode(encode(Command.FAILED, failure=FAILURES[1].to_dict()))
    assert NodeFailure.from_dict(body["failure"]) == FAILURES[1]


def test_decode_one_line_without_its_newline() -> None:
    assert decode(b'{"type": "finished"}') == ("finished", {})


def test_non_ascii_hosts_survive() -> None:
    failure = NodeFailure(node=1, host="nœud-1", status=1, what="rank 2 exit 1 — ü", rank=2)
    _, body = decode(encode(Event.CAUSE, failure=failure.to_dict()))
    assert NodeFailure.from_dict(body["failure"]) == failure


def test_message_kinds_are_distinct() -> None:
    values = [k.value for k in (*Event, *Command)]
    assert len(values) == len(set(values))
