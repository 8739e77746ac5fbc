"""A multi-node job's outcome: the status rules with another node's failure, the terminal
report, and the same facts on the bus (JobView properties) and in the journal record."""

from __future__ import annotations

import dataclasses
import json
import socket
from pathlib import Path

import pytest
from dbus_fast import Variant
from dbus_fast.introspection import Node

from gpulaunch.base.protocol import Layout, NodeFailure
from gpulaunch.jobapi import record
from gpulaunch.jobapi.interface import interface_xml
from gpulaunch.jobapi.record import Recorder
from gpulaunch.jobapi.view import INTERFACE, NODE_SIGNATURE, JobState, JobView
from gpulaunch.model import (
    Cause,
    JobProgress,
    JobReport,
    Phase,
    RankExit,
    RankResult,
    job_outcome,
)
from gpulaunch.report import format_report, headline, nodes_line
from gpulaunch.supervisor.systemd import SystemdSupervisor
from gpulaunch.watcher.loop import Watcher
from tests.unit.fakes import LAYOUT, NODES, FakeSystemd, decode, entry, make_job, sh
from tests.unit.fakes import multinode_view as view


def ok(t: float) -> RankExit:
    return RankExit(code=0, signal=None, stopped_by_watcher=False, observed_at=t, runtime=t)


def code(c: int, t: float) -> RankExit:
    return RankExit(code=c, signal=None, stopped_by_watcher=False, observed_at=t, runtime=t)


def stopped(t: float) -> RankExit:
    return RankExit(code=None, signal=15, stopped_by_watcher=True, observed_at=t, runtime=t)


# -- the status rules --------------------------------------------------------------

CASES = [
    # (exits by rank, interrupt, elsewhere, status, cause, cause rank)
    # another node failed first: its status, no local cause rank
    ({2: stopped(3), 3: stopped(3)}, None, (2.0, 1), 1, Cause.NODE_FAILED, None),
    ({2: stopped(3)}, None, (2.0, 75), 75, Cause.NODE_FAILED, None),
    # ... even when a local rank failed (before or after): the store decided for every node
    ({2: code(7, 1), 3: stopped(3)}, None, (2.0, 1), 1, Cause.NODE_FAILED, None),
    ({2: code(7, 3), 3: stopped(3)}, None, (2.0, 1), 1, Cause.NODE_FAILED, None),
    # ... and when every local rank had already succeeded
    ({2: ok(1), 3: ok(1)}, None, (2.0, 139), 139, Cause.NODE_FAILED, None),
    # an interrupt of this node before the news is this node's cause
    ({2: stopped(3)}, (1.0, 2), (2.0, 1), 130, Cause.INTERRUPTED, None),
    ({2: stopped(3)}, (1.0, 15), (2.0, 1), 143, Cause.INTERRUPTED, None),
    ({2: code(9, 3)}, (1.0, 15), (2.0, 1), 143, Cause.INTERRUPTED, None),
    # ... one after it is not
    ({2: stopped(3)}, (2.5, 2), (2.0, 1), 1, Cause.NODE_FAILED, None),
    # no news from elsewhere: the single-node rules
    ({2: code(7, 1), 3: stopped(2)}, None, None, 7, Cause.RANK_FAILED, 2),
    ({2: ok(1), 3: ok(2)}, None, None, 0, Cause.SUCCEEDED, None),
    ({2: stopped(3)}, (1.0, 2), None, 130, Cause.INTERRUPTED, None),
]


@pytest.mark.parametrize(
    ("exits", "interrupt", "elsewhere", "status", "cause", "cause_rank"), CASES
)
def test_job_outcome_with_news_from_elsewhere(  # type: ignore[no-untyped-def]
    exits, interrupt, elsewhere, status, cause, cause_rank
) -> None:
    outcome = job_outcome(exits, interrupt, elsewhere)
    assert (outcome.status, outcome.cause, outcome.cause_rank) == (status, cause, cause_rank)


def test_interrupt_between_a_local_failure_and_the_news() -> None:
    """This node's rank 2 failed first (t=0.5), the store picked another node's failure,
    then an interrupt (t=1.0), then the news (t=2.0): the store's verdict, as without the
    interrupt; only an interrupt before this node's own first failure stays the cause."""
    outcome = job_outcome({2: code(5, 0.5), 3: stopped(3)}, (1.0, 2), (2.0, 1))
    assert (outcome.status, outcome.cause, outcome.cause_rank) == (1, Cause.NODE_FAILED, None)


# -- the terminal report -----------------------------------------------------------

REMOTE = NodeFailure(
    node=1,
    host="hostB",
    status=1,
    what="rank 3 exit 1",
    rank=3,
    error='Traceback (most recent call last):\n  File "train.py", line 3\nValueError: boom',
    error_source="its error file (@record)",
)
STOPPED_RANKS = (
    RankResult(0, "gpulaunch-j-rank0.scope", 10, stopped(2.0)),
    RankResult(1, "gpulaunch-j-rank1.scope", 11, stopped(2.0)),
)


def report(**kw: object) -> JobReport:
    base: dict[str, object] = dict(
        job="j",
        status=1,
        cause=Cause.NODE_FAILED,
        cause_rank=None,
        interrupt_signal=None,
        ranks=STOPPED_RANKS,
        layout=LAYOUT,
        node_failure=REMOTE,
    )
    base.update(kw)
    return JobReport(**base)  # type: ignore[arg-type]


def test_nodes_line() -> None:
    assert nodes_line(LAYOUT) == (
        "node 0 of 3; nodes: 0 hostA ranks 0-1, 1 hostB ranks 2-3, 2 hostC ranks 4-4"
    )
    assert nodes_line(dataclasses.replace(LAYOUT, node_rank=2)).startswith("node 2 of 3; ")


def test_headline_names_the_other_node() -> None:
    assert (
        headline(report()) == "gpulaunch: job j stopped: node 1 (hostB): rank 3 exit 1 (status 1)"
    )


def test_headline_of_a_lost_store() -> None:
    lost = NodeFailure(-1, "hostA:29500", 75, "the job's store at hostA:29500 went away")
    assert headline(report(status=75, node_failure=lost)) == (
        "gpulaunch: job j stopped: the job's store at hostA:29500 went away (status 75)"
    )


def test_report_of_a_failure_on_another_node() -> None:
    assert format_report(report()) == "\n".join(
        [
            "gpulaunch: job j stopped: node 1 (hostB): rank 3 exit 1 (status 1)",
            "  node 0 of 3; nodes: 0 hostA ranks 0-1, 1 hostB ranks 2-3, 2 hostC ranks 4-4",
            "  rank  unit                     pid  exit     how      runtime",
            "  0     gpulaunch-j-rank0.scope  10   SIGTERM  stopped  2.00s",
            "  1     gpulaunch-j-rank1.scope  11   SIGTERM  stopped  2.00s",
            "rank 3's error (on node 1), from its error file (@record):",
            "  Traceback (most recent call last):",
            '    File "train.py", line 3',
            "  ValueError: boom",
        ]
    )


def test_report_without_the_remote_error() -> None:
    bare = dataclasses.replace(REMOTE, error=None, error_source=None)
    text = format_report(report(node_failure=bare))
    assert "error" not in text and "the job's first failure" not in text


def test_report_of_a_lost_node() -> None:
    lost = NodeFailure(node=2, host="hostC", status=75, what="lost: no heartbeat for 6.0 s")
    lines = format_report(report(status=75, node_failure=lost)).splitlines()
    assert (
        lines[0]
        == "gpulaunch: job j stopped: node 2 (hostC): lost: no heartbeat for 6.0 s (status 75)"
    )
    assert lines[1].startswith("  node 0 of 3; ")
    assert lines[2].startswith("  rank  unit")


def test_own_rank_failure_prints_no_first_failure_line() -> None:
    """This node's rank failed first and the store agreed: the report is the local one."""
    own = NodeFailure(
        node=0, host="hostA", status=7, what="rank 1 exit 7", rank=1, error="boom", error_source="x"
    )
    ranks = (
        RankResult(0, "gpulaunch-j-rank0.scope", 10, stopped(2.0)),
        RankResult(
            1,
            "gpulaunch-j-rank1.scope",
            11,
            code(7, 1.0),
            error="Traceback\nValueError: seven",
            error_source="its error file (@record)",
        ),
    )
    text = format_report(
        report(status=7, cause=Cause.RANK_FAILED, cause_rank=1, ranks=ranks, node_failure=own)
    )
    assert text == "\n".join(
        [
            "gpulaunch: job j failed: rank 1 exit 7 (status 7)",
            "  node 0 of 3; nodes: 0 hostA ranks 0-1, 1 hostB ranks 2-3, 2 hostC ranks 4-4",
            "  rank  unit                     pid  exit     how      runtime",
            "  1     gpulaunch-j-rank1.scope  11   exit 7   cause    1.00s",
            "  0     gpulaunch-j-rank0.scope  10   SIGTERM  stopped  2.00s",
            "rank 1's error, from its error file (@record):",
            "  Traceback",
            "  ValueError: seven",
        ]
    )


def test_own_interrupt_prints_no_first_failure_line() -> None:
    own = NodeFailure(node=0, host="hostA", status=130, what="interrupted by SIGINT")
    text = format_report(
        report(status=130, cause=Cause.INTERRUPTED, interrupt_signal=2, node_failure=own)
    )
    assert text.splitlines()[0] == "gpulaunch: job j stopped by SIGINT (status 130)"
    assert "the job's first failure" not in text
    assert "(on node" not in text


def test_interrupt_here_names_the_jobs_first_failure_elsewhere() -> None:
    """Interrupted before the news came: this node's cause, and the job's first failure too."""
    text = format_report(report(status=130, cause=Cause.INTERRUPTED, interrupt_signal=2))
    lines = text.splitlines()
    assert lines[0] == "gpulaunch: job j stopped by SIGINT (status 130)"
    assert lines[2] == "  the job's first failure: node 1 (hostB): rank 3 exit 1"
    assert lines[3].startswith("  rank  unit")
    assert "(on node 1)" not in text  # the remote traceback belongs to a node-failed report


def test_no_nodes_line_for_one_node() -> None:
    ranks = (RankResult(0, "gpulaunch-j-rank0.scope", 10, ok(1.0)),)
    text = format_report(
        report(status=0, cause=Cause.SUCCEEDED, ranks=ranks, layout=None, node_failure=None)
    )
    assert text.splitlines()[0] == "gpulaunch: job j succeeded (its rank exited 0)"
    assert "node" not in text


# -- the job on the bus and in the journal ---------------------------------------------


SINGLE = dict(node_rank=-1, nodes=(), cause_node=-1, cause_host="", cause_what="")


def test_properties_fit_the_shipped_interface() -> None:
    node = Node.parse(interface_xml())
    (iface,) = [i for i in node.interfaces if i.name == INTERFACE]
    props = view().properties()
    assert {p.name: p.signature for p in iface.properties} == {k: v[0] for k, v in props.items()}
    assert props["Nodes"][0] == "a" + NODE_SIGNATURE
    for sig, value in props.values():
        Variant(sig, value)


def test_properties_of_a_multi_node_job() -> None:
    props = {k: value for k, (_, value) in view().properties().items()}
    assert props["NodeRank"] == 0
    assert props["Nodes"] == [
        [0, "hostA", 0, 2, 100],
        [1, "hostB", 2, 2, 200],
        [2, "hostC", 4, 1, 300],
    ]
    assert (props["CauseNode"], props["CauseHost"], props["CauseWhat"]) == (
        1,
        "hostB",
        "rank 3 exit 1",
    )
    assert props["Cause"] == "node-failed" and props["CauseRank"] == -1


@pytest.mark.parametrize(
    "v",
    [
        view(),
        view(cause_node=-1, cause_host="hostA:29500", cause_what="the job's store went away"),
        view(
            state=JobState.RUNNING, status=-1, cause="", cause_node=-1, cause_host="", cause_what=""
        ),
        view(state=JobState.STOPPED, status=130, cause="interrupted", node_rank=2),
        view(**SINGLE, world_size=2),  # type: ignore[arg-type]
    ],
)
def test_properties_round_trip(v: JobView) -> None:
    assert JobView.from_properties({k: value for k, (_, value) in v.properties().items()}) == v


def test_single_node_properties() -> None:
    props = view(**SINGLE, world_size=2).properties()  # type: ignore[arg-type]
    assert props["NodeRank"] == ("i", -1)
    assert props["Nodes"] == ("a(isuuu)", [])
    assert (props["CauseNode"], props["CauseHost"], props["CauseWhat"]) == (
        ("i", -1),
        ("s", ""),
        ("s", ""),
    )


def test_properties_of_an_older_watcher() -> None:
    """A watcher without the node properties reads as a single-node job."""
    props = {k: value for k, (_, value) in view(**SINGLE).properties().items()}  # type: ignore[arg-type]
    for name in ("NodeRank", "Nodes", "CauseNode", "CauseHost", "CauseWhat"):
        del props[name]
    back = JobView.from_properties(props)
    assert (back.node_rank, back.nodes, back.cause_node, back.cause_host, back.cause_what) == (
        -1,
        (),
        -1,
        "",
        "",
    )
    assert back.layout is None and back.node_failure is None


def test_to_json_of_a_multi_node_job() -> None:
    data = view().to_json()
    assert data["node_rank"] == 0
    assert data["nodes"][1] == {"node": 1, "host": "hostB", "first_rank": 2, "nproc": 2, "pid": 200}
    assert data["node_cause"] == {
        "node": 1,
        "host": "hostB",
        "status": 1,
        "what": "rank 3 exit 1",
        "rank": None,
        "error": None,
        "error_source": None,
    }
    assert data["cause"] == "node-failed" and data["cause_rank"] is None
    json.dumps(data)  # serializable as it is


def test_to_json_of_a_single_node_job() -> None:
    data = view(**SINGLE, world_size=2, cause="rank-failed", cause_rank=1).to_json()  # type: ignore[arg-type]
    assert (data["node_rank"], data["nodes"], data["node_cause"]) == (None, [], None)


def test_view_report_of_a_node_failure() -> None:
    rep = view().report()
    assert rep.cause is Cause.NODE_FAILED and rep.cause_rank is None and rep.status == 1
    assert rep.interrupt_signal is None
    assert rep.layout is not None and (rep.layout.node_rank, rep.layout.nnodes) == (0, 3)
    assert rep.node_failure == NodeFailure(node=1, host="hostB", status=1, what="rank 3 exit 1")
    lines = format_report(rep).splitlines()
    assert lines[0] == "gpulaunch: job j stopped: node 1 (hostB): rank 3 exit 1 (status 1)"
    assert lines[1] == (
        "  node 0 of 3; nodes: 0 hostA ranks 0-1, 1 hostB ranks 2-3, 2 hostC ranks 4-4"
    )
    assert [line.split()[4] for line in lines[3:5]] == ["stopped", "stopped"]


def test_view_report_of_an_interrupt_before_the_news() -> None:
    rep = view(status=130, cause="interrupted").report()
    assert rep.cause is Cause.INTERRUPTED and rep.interrupt_signal == 2
    text = format_report(rep)
    assert "  the job's first failure: node 1 (hostB): rank 3 exit 1" in text.splitlines()


def test_view_report_of_a_single_node_job() -> None:
    rep = view(**SINGLE, world_size=2, status=143, cause="interrupted").report()  # type: ignore[arg-type]
    assert rep.layout is None and rep.node_failure is None
    assert "node" not in format_report(rep)


@pytest.mark.parametrize(
    "v",
    [
        view(),
        view(cause_node=-1, cause_host="hostA:29500", cause_what="the job's store went away"),
        view(state=JobState.STOPPED, status=130, cause="interrupted", node_rank=2),
        view(
            state=JobState.SUCCEEDED,
            status=0,
            cause="succeeded",
            cause_node=-1,
            cause_host="",
            cause_what="",
        ),
        view(**SINGLE, world_size=2, cause="rank-failed", cause_rank=1, status=7),  # type: ignore[arg-type]
    ],
)
def test_record_round_trip(v: JobView) -> None:
    assert record.parse(entry(v)) == dataclasses.replace(v, ended_at=1700000000000000)


def test_record_fields_of_a_multi_node_job() -> None:
    e = entry(view())
    assert e["GPULAUNCH_NODE_RANK"] == "0"
    assert json.loads(e["GPULAUNCH_NODES"]) == [
        [0, "hostA", 0, 2, 100],
        [1, "hostB", 2, 2, 200],
        [2, "hostC", 4, 1, 300],
    ]
    assert (e["GPULAUNCH_CAUSE_NODE"], e["GPULAUNCH_CAUSE_HOST"], e["GPULAUNCH_CAUSE_WHAT"]) == (
        "1",
        "hostB",
        "rank 3 exit 1",
    )
    assert e["GPULAUNCH_CAUSE"] == "node-failed" and "GPULAUNCH_CAUSE_RANK" not in e


def test_record_of_a_multi_node_success_has_no_cause_fields() -> None:
    e = entry(
        view(state=JobState.SUCCEEDED, status=0, cause="succeeded", cause_node=-1, cause_what="")
    )
    assert e["GPULAUNCH_NODE_RANK"] == "0"
    assert not {"GPULAUNCH_CAUSE_NODE", "GPULAUNCH_CAUSE_HOST", "GPULAUNCH_CAUSE_WHAT"} & set(e)


def test_record_of_a_single_node_job_has_no_node_fields() -> None:
    e = entry(view(**SINGLE, world_size=2, cause="rank-failed", cause_rank=1, status=7))  # type: ignore[arg-type]
    assert not {
        k for k in e if "NODE" in k or k in ("GPULAUNCH_CAUSE_HOST", "GPULAUNCH_CAUSE_WHAT")
    }
    back = record.parse(e)
    assert (back.node_rank, back.nodes, back.cause_node, back.cause_what) == (-1, (), -1, "")


# -- from a watcher ------------------------------------------------------------------


def run_recorded(tmp_path: Path, layout: Layout | None) -> tuple[dict[str, str], JobReport]:
    sent: list[bytes] = []
    spec, units = make_job([sh("exit 0"), sh("exit 0")], job="mn")
    if layout is not None:
        spec = dataclasses.replace(spec, layout=layout, world_size=layout.world_size)
    r, w = socket.socketpair()
    with r, w:
        rep = Watcher(
            spec,
            SystemdSupervisor(FakeSystemd(), units),
            r.fileno(),
            parts=[Recorder(send=sent.append)],
            runtime_dir=tmp_path,
        ).run()
    (data,) = sent
    return decode(data), rep


def test_watcher_of_one_node_records_no_node_fields(tmp_path: Path) -> None:
    e, rep = run_recorded(tmp_path, None)
    assert rep.cause is Cause.SUCCEEDED and rep.layout is None and rep.node_failure is None
    assert not {k for k in e if "NODE" in k}
    back = record.parse({**e, "_UID": "0"})
    assert (back.node_rank, back.nodes) == (-1, ())


def test_watcher_of_a_node_records_its_layout(tmp_path: Path) -> None:
    """Node 0 of two (no peer here: nothing comes from the other node)."""
    lay = dataclasses.replace(LAYOUT, nnodes=2, world_size=4, nodes=NODES[:2])
    e, rep = run_recorded(tmp_path, lay)
    assert rep.cause is Cause.SUCCEEDED and rep.layout == lay
    assert e["GPULAUNCH_NODE_RANK"] == "0" and e["GPULAUNCH_WORLD_SIZE"] == "4"
    assert json.loads(e["GPULAUNCH_NODES"]) == [[0, "hostA", 0, 2, 100], [1, "hostB", 2, 2, 200]]
    assert "GPULAUNCH_CAUSE_WHAT" not in e
    back = record.parse({**e, "_UID": "0"})
    assert back.nodes == NODES[:2] and back.layout is not None
    assert nodes_line(back.layout) == "node 0 of 2; nodes: 0 hostA ranks 0-1, 1 hostB ranks 2-3"


def test_status_of_a_job_another_node_failed_names_that_rank() -> None:
    """`status`, `wait` and `stop` print the failed rank of the other node, never 'rank None'."""
    spec, _ = make_job([sh("exit 0"), sh("exit 0")], job="j")
    spec = dataclasses.replace(spec, layout=LAYOUT, world_size=LAYOUT.world_size)
    progress = JobProgress(
        spec=spec, phase=Phase.DONE, ranks=(), attempt=0, watcher_pid=1, node_failure=REMOTE
    )
    live = JobView.of_progress(progress, report())
    props = {name: value for name, (_, value) in live.properties().items()}
    for v in (live, record.parse(entry(live))):  # the Finished signal carries `live` too
        text = format_report(v.report())
        assert "rank None" not in text
        assert "rank 3's error (on node 1), from its error file (@record):" in text
        assert "ValueError: boom" in text
        assert v.report().node_failure == REMOTE
    on_bus = JobView.from_properties(props).report()  # the properties carry no error text
    assert on_bus.node_failure is not None and on_bus.node_failure.rank == 3
    assert "rank None" not in format_report(on_bus)
