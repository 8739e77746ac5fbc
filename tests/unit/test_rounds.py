"""Restarts across nodes: what follows a round's failure (multinode/rounds.py), and the
record of the earlier attempts in the report, the journal record and `status --json`."""

from __future__ import annotations

import dataclasses
import json

import pytest

from gpulaunch.base.protocol import (
    JOINING_NODE,
    NODE_LOST_STATUS,
    Backend,
    Command,
    Layout,
    NodeConfig,
    NodeFailure,
    RoundEnd,
    decode,
    encode,
)
from gpulaunch.jobapi import record
from gpulaunch.jobapi.view import JobState, JobView
from gpulaunch.model import Cause, JobReport
from gpulaunch.multinode.rounds import Next, after_failure
from gpulaunch.report import format_report
from tests.unit.fakes import LAYOUT, entry
from tests.unit.fakes import multinode_view as view

STATIC = NodeConfig(Backend.STATIC, "hostA:29500", "j", 3, 2, "j", node_rank=0)
C10D = dataclasses.replace(STATIC, backend=Backend.C10D, node_rank=None)
ELASTIC = dataclasses.replace(C10D, min_nodes=2)
OURS = dataclasses.replace(ELASTIC, backend=Backend.GPULAUNCH)  # gpulaunch's own rendezvous
RANK_FAILED = NodeFailure(node=1, host="hostB", status=1, what="rank 3 exit 1", rank=3)
LOST = NodeFailure(node=2, host="hostC", status=NODE_LOST_STATUS, what="its watcher died")
INTERRUPTED = NodeFailure(node=1, host="hostB", status=143, what="interrupted by SIGTERM")
JOINING = NodeFailure(node=JOINING_NODE, host="", status=NODE_LOST_STATUS, what="a node waits")
STORE_GONE = NodeFailure(node=-1, host="hostA:29500", status=NODE_LOST_STATUS, what="store gone")


def used(failures: int) -> Layout:
    return dataclasses.replace(LAYOUT, failures=failures)


@pytest.mark.parametrize(
    ("failure", "config", "failures", "max_restarts", "expected"),
    [
        # a rank failure on any node restarts every node while --max-restarts allows
        (RANK_FAILED, STATIC, 0, 1, Next.RESTART),
        (RANK_FAILED, C10D, 0, 3, Next.RESTART),
        (RANK_FAILED, STATIC, 1, 1, Next.END),
        (RANK_FAILED, STATIC, 0, 0, Next.END),
        (RANK_FAILED, ELASTIC, 0, 0, Next.END),  # elastic or not: a failure is a failure
        # a lost node: static cannot replace it; c10d meets again, elastic for free
        (LOST, STATIC, 0, 3, Next.END),
        (LOST, C10D, 0, 3, Next.RESTART),
        (LOST, C10D, 3, 3, Next.END),
        (LOST, ELASTIC, 0, 0, Next.REGROUP),
        (LOST, ELASTIC, 5, 1, Next.REGROUP),
        (LOST, OURS, 0, 0, Next.REGROUP),  # gpulaunch's rendezvous: as c10d's
        (RANK_FAILED, OURS, 0, 1, Next.RESTART),
        # a node that was told to stop, or the store gone: the end everywhere
        (INTERRUPTED, C10D, 0, 3, Next.END),
        (INTERRUPTED, ELASTIC, 0, 3, Next.END),
        (STORE_GONE, ELASTIC, 0, 3, Next.END),
        # a node waits to join an elastic job: every node meets again, for free
        (JOINING, ELASTIC, 0, 0, Next.REGROUP),
    ],
)
def test_what_follows_a_round(
    failure: NodeFailure, config: NodeConfig, failures: int, max_restarts: int, expected: Next
) -> None:
    assert after_failure(failure, used(failures), config, max_restarts) is expected


def test_this_nodes_own_loss_is_its_end() -> None:
    own = dataclasses.replace(LOST, node=LAYOUT.node_rank)
    assert after_failure(own, LAYOUT, ELASTIC, 3) is Next.END


def test_round_codecs() -> None:
    ended = RoundEnd(attempt=2, cause=RANK_FAILED)
    assert RoundEnd.from_dict(json.loads(json.dumps(ended.to_dict()))) == ended
    assert ended.describe() == "attempt 2: node 1 (hostB): rank 3 exit 1 (status 1)"
    kind, body = decode(encode(Command.NEXT_ROUND, attempt=2, failures=1).rstrip(b"\n"))
    assert (kind, body) == ("next-round", {"attempt": 2, "failures": 1})
    layout = dataclasses.replace(LAYOUT, attempt=2, failures=1)
    assert Layout.from_dict(json.loads(json.dumps(layout.to_dict()))) == layout
    assert NodeConfig.from_json(ELASTIC.to_json()) == ELASTIC
    assert (ELASTIC.wanted, C10D.wanted) == ("2 to 3", "3")


ROUNDS = (RoundEnd(0, RANK_FAILED), RoundEnd(1, LOST))


def test_the_report_lists_every_earlier_attempt() -> None:
    rep = JobReport(
        job="j",
        status=0,
        cause=Cause.SUCCEEDED,
        cause_rank=None,
        interrupt_signal=None,
        restarts=2,
        layout=LAYOUT,
        rounds=ROUNDS,
    )
    lines = format_report(rep).splitlines()
    assert "  attempt 0: node 1 (hostB): rank 3 exit 1 (status 1); every node went on" in lines
    assert "  attempt 1: node 2 (hostC): its watcher died (status 75); every node went on" in lines


def test_record_keeps_the_rounds() -> None:
    v: JobView = view(rounds=ROUNDS, state=JobState.SUCCEEDED, status=0, cause="succeeded")
    e = entry(v)
    assert json.loads(e["GPULAUNCH_ROUNDS"])[1] == {"attempt": 1, **LOST.to_dict()}
    parsed = record.parse(e)
    assert parsed.rounds == ROUNDS
    assert parsed.report().rounds == ROUNDS
    assert parsed.to_json()["rounds"][0]["attempt"] == 0
    assert "GPULAUNCH_ROUNDS" not in entry(view())


def test_a_rank_failure_across_nodes_follows_restart_on_and_no_restart_codes() -> None:
    """recovery/'s policy decides for every node alike, from the status each node has."""
    from gpulaunch.recovery.classes import FailureClass
    from gpulaunch.recovery.settings import RestartPolicy

    config = dataclasses.replace(STATIC, node_rank=0)
    exit78 = dataclasses.replace(RANK_FAILED, status=78, what="rank 3 exit 78")
    killed = dataclasses.replace(RANK_FAILED, status=128 + 9, what="rank 3 SIGKILL")
    default = RestartPolicy()
    assert after_failure(exit78, used(0), config, 3, default) is Next.END  # EX_CONFIG
    assert after_failure(RANK_FAILED, used(0), config, 3, default) is Next.RESTART
    exits_only = RestartPolicy(restart_on=frozenset({FailureClass.EXIT}))
    assert after_failure(killed, used(0), config, 3, exits_only) is Next.END
    assert after_failure(RANK_FAILED, used(0), config, 3, exits_only) is Next.RESTART
    codes = RestartPolicy(no_restart_codes=frozenset({1, 78}))
    assert after_failure(RANK_FAILED, used(0), config, 3, codes) is Next.END
