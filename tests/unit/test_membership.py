"""gpulaunch's own rendezvous (gpulaunch/multinode/membership.py): its pure rules, and the
membership file told to the ranks (gpulaunch/multinode/roster.py).

The handler itself runs on torch's TCPStore in tests/integration/test_multinode_restarts.py
and test_membership_nodes.py (real boxes, real stores)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from gpulaunch import cli
from gpulaunch.base.protocol import NODE_LOST_STATUS, Backend, Layout, NodeFailure, NodeInfo
from gpulaunch.errors import UsageError
from gpulaunch.multinode import roster
from gpulaunch.multinode.membership import Liveness, can_close, node_order
from gpulaunch.plan.nodes import NodeOptions, liveness, plan_nodes

A, B, C, D = "10.0.0.1/5/aa", "10.0.0.2/6/bb", "10.0.0.3/7/cc", "10.0.0.4/8/dd"


def test_the_default_bound_is_two_seconds_at_twenty_beats() -> None:
    live = Liveness.for_timeout(2.0)
    assert live.interval == pytest.approx(0.1)
    # seen at most a beat late, judged at most a beat after: lost within the timeout
    assert live.silent + 2 * live.interval == pytest.approx(2.0)
    assert liveness(Backend.GPULAUNCH, None) == pytest.approx((0.1, 1.8, 2.0))
    assert liveness(Backend.GPULAUNCH, 10.0) == pytest.approx((0.5, 9.0, 10.0))
    assert liveness(Backend.C10D, None) == (1.0, 5.0, 6.0)  # torch's keeps what it had


def test_a_round_closes_once_every_node_alive_joined() -> None:
    alive = {A, B}  # C was lost: silent
    assert can_close([A, B], alive, 2, 3, last_call_over=True)
    assert not can_close([A], alive, 1, 3, last_call_over=True)  # B is alive: wait for it
    assert not can_close([A, C], alive, 2, 3, last_call_over=True)  # C joined, then died
    assert not can_close([A, B], {A, B, C}, 2, 3, last_call_over=True)


def test_the_first_rounds_last_call_and_max() -> None:
    assert not can_close([A, B], {A, B}, 2, 3, last_call_over=False)
    assert can_close([A, B, C], {A, B, C, D}, 2, 3, last_call_over=False)  # MAX: at once
    assert not can_close([A], {A}, 2, 3, last_call_over=True)  # fewer than MIN


def test_members_are_ordered_by_address_and_capped_at_max() -> None:
    assert node_order([], [C, A, B], {A, B, C}, 3) == [A, B, C]
    # a node from the last round keeps its place before a newcomer; the dead are left out
    assert node_order([B, C], [D, A, B, C], {A, B, D}, 2) == [B, D]
    assert node_order([], [A, A, B], {A, B}, 3) == [A, B]


def test_gpulaunch_backend_plans_as_an_elastic_one() -> None:
    opts = NodeOptions(
        nnodes="2:3", rdzv_backend="gpulaunch", rdzv_endpoint="n0:29400", node_timeout=4.0
    )
    config = plan_nodes(opts, None, None, 0, "train", {}).config
    assert config is not None
    assert config.backend is Backend.GPULAUNCH and config.min_nodes == 2
    assert (config.heartbeat_interval, config.heartbeat_timeout) == pytest.approx((0.2, 3.6))
    with pytest.raises(UsageError, match="--rdzv-backend gpulaunch needs --rdzv-endpoint"):
        plan_nodes(NodeOptions(nnodes="2", rdzv_backend="gpulaunch"), None, None, 0, "t", {})


@pytest.mark.parametrize("value", ["0.1", "601", "soon"])
def test_a_bad_node_timeout_is_one_line(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(["start", "--nnodes", "2", "--node-timeout", value, "x.py"])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "--node-timeout" in err[-1] and "Traceback" not in "\n".join(err)


def _layout(hosts: list[str], attempt: int) -> Layout:
    nodes = tuple(
        NodeInfo(node=i, host=h, first_rank=2 * i, nproc=2, pid=100 + int(h[-1]))
        for i, h in enumerate(hosts)
    )
    return Layout(
        node_rank=0,
        nnodes=len(nodes),
        world_size=2 * len(nodes),
        master_addr="h0",
        master_port=1,
        use_agent_store=True,
        run_id="r",
        endpoint="h0:29400",
        nodes=nodes,
        attempt=attempt,
    )


def test_the_membership_file_says_who_left_and_why(tmp_path: Path) -> None:
    before, after = _layout(["h0", "h1", "h2"], 0), _layout(["h0", "h2"], 1)
    lost = NodeFailure(node=1, host="h1", status=NODE_LOST_STATUS, what="lost: no heartbeat")
    ending = roster.membership(before, None, lost, "ending", 5.0)
    assert ending["state"] == "ending" and ending["generation"] == 0
    assert ending["left"] == [{"node": 1, "host": "h1", "ranks": [2, 3], "why": lost.what}]
    data = roster.membership(after, before, lost, "running", 6.0)
    assert data["generation"] == 1 and data["world_size"] == 4 and data["decided_at"] == 6.0
    assert data["nodes"] == [
        {"node": 0, "host": "h0", "ranks": [0, 1]},
        {"node": 1, "host": "h2", "ranks": [2, 3]},
    ]
    assert data["left"] == [{"node": 1, "host": "h1", "ranks": [2, 3], "why": lost.what}]
    path = tmp_path / "m.json"
    roster.write(str(path), data)
    assert json.loads(path.read_text()) == data
    assert [p.name for p in tmp_path.iterdir()] == ["m.json"]  # no temporary file left
    roster.remove(str(path))
    assert not path.exists()


def test_a_rank_failure_is_nobody_leaving() -> None:
    layout = _layout(["h0", "h1"], 0)
    failed = NodeFailure(node=1, host="h1", status=1, what="rank 3 exit 1", rank=3)
    data = roster.membership(layout, None, failed, "ending", None)
    assert data["left"] == [] and data["cause_rank"] == 3
    again = dataclasses.replace(layout, attempt=1)
    restarted = roster.membership(again, layout, failed, "running", 1.0)
    assert restarted["left"] == []
