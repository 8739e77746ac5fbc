"""One shape for a rank's end: a `RankExit` survives every path from the watcher to an output.

The watcher's `RankExit` becomes a `RankView` (jobapi/rankview.py) and is serialised only at
the wire: the bus (its Ranks struct plus RankEnds, through dbus_fast's real marshalling), the
Finished signal with the PropertiesChanged before it (`wait`), the journal record, the direct
supervisor's record file, `--json`. Every path must give back the same `RankExit` facts and
the same text: `status`, `wait` and the report print `SIGSEGV (core dumped)` and the OOM kill
as the live report did.
"""

from __future__ import annotations

import io
import json
import signal
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from dbus_fast import Message, MessageType, Variant
from dbus_fast._private.unmarshaller import Unmarshaller

from gpulaunch.jobapi import filerecord, record
from gpulaunch.jobapi.commands import _live
from gpulaunch.jobapi.rankview import RankView, with_ends
from gpulaunch.jobapi.view import JobState, JobView
from gpulaunch.model import OomKill, RankExit, RankProgress, RankState, RankUsage
from gpulaunch.report import format_report

GIB = 1 << 30
SEGV = RankExit(None, signal.SIGSEGV, False, 0.0, 2.5, core_dumped=True)
OOM = RankExit(
    None,
    signal.SIGKILL,
    False,
    0.0,
    3.0,
    usage=RankUsage(cpu_sec=1.5),
    oom=OomKill(int(11.8 * GIB), 12 * GIB, "memory.events"),
)
OOM_UNKNOWN = RankExit(None, signal.SIGKILL, False, 0.0, 1.0, oom=OomKill(None, None, "kmsg"))
CODE = RankExit(7, None, False, 0.0, 1.25)
ENDS = {
    "SIGSEGV (core dumped)": SEGV,
    "killed by the OOM killer at 11.8 GiB (limit 12.0 GiB)": OOM,
    "killed by the OOM killer": OOM_UNKNOWN,
    "exit 7": CODE,
}


def job_view(ex: RankExit) -> JobView:
    rank = RankView.of_progress(
        RankProgress(0, 0, "gpulaunch-j-rank0.scope", RankState.EXITED, 10, False, ex)
    )
    return JobView(
        job="j",
        slice="gpulaunch-j.slice",
        manager="system",
        owner=0,
        watcher_pid=9,
        state=JobState.FAILED,
        world_size=1,
        ranks=(rank,),
        status=ex.status,
        cause="rank-failed",
        cause_rank=0,
    )


def on_the_wire(signature: str, body: list[Any]) -> list[Any]:
    """`body` marshalled by dbus_fast as a signal and read back."""
    msg = Message(
        message_type=MessageType.SIGNAL,
        path="/io/gpulaunch/job/j",
        interface="io.gpulaunch.Job1",
        member="Test",
        signature=signature,
        body=body,
    )
    unmarshaller = Unmarshaller(io.BytesIO(msg._marshall(False)))  # type: ignore[arg-type]  # noqa: SLF001
    back = unmarshaller.unmarshall()
    assert back is not None
    return list(back.body)


def via_bus(view: JobView) -> JobView:
    """GetAll's a{sv}, through the wire."""
    props = {k: Variant(sig, v) for k, (sig, v) in view.properties().items()}
    (got,) = on_the_wire("a{sv}", [props])
    return JobView.from_properties({k: v.value for k, v in got.items()})


def via_finished(view: JobView) -> JobView:
    """`wait`: the Finished signal's ranks, with RankEnds from the PropertiesChanged before."""
    sig, ends = view.properties()["RankEnds"]
    (wired,) = on_the_wire("a(iisusiibid)", [[r.wire() for r in view.ranks]])
    (wired_ends,) = on_the_wire(sig, [ends])
    return JobView(
        **{**view.__dict__, "ranks": with_ends(tuple(map(RankView.from_wire, wired)), wired_ends)}
    )


def via_json(view: JobView) -> JobView:
    """--json (and the records' RANKS field)."""
    ranks = json.loads(json.dumps(view.to_json()))["ranks"]
    return replace(view, ranks=tuple(RankView.from_json(r) for r in ranks))


def via_record(view: JobView) -> JobView:
    """The journal record, as journalctl -o json gives its fields back."""
    return record.parse(dict(record.fields(view, "the end")))


def via_file(view: JobView, tmp: Path) -> JobView:
    """The direct supervisor's record file."""
    filerecord.write(view, "the end", tmp)
    found = filerecord.find(view.job, tmp)
    assert found is not None
    return found


PATHS = ("bus", "finished", "json", "record", "file")


def through(path: str, view: JobView, tmp: Path) -> JobView:
    if path == "file":
        return via_file(view, tmp)
    return {"bus": via_bus, "finished": via_finished, "json": via_json, "record": via_record}[path](
        view
    )


@pytest.mark.parametrize("text", ENDS)
@pytest.mark.parametrize("path", PATHS)
def test_a_ranks_end_survives_every_path(path: str, text: str, tmp_path: Path) -> None:
    ex = ENDS[text]
    assert ex.describe() == text  # the live report's words
    sent = job_view(ex)
    got = through(path, sent, tmp_path).ranks[0]
    back = got.result().exit
    assert back is not None
    assert back.describe() == text
    assert (back.code, back.signal, back.core_dumped, back.oom, back.status) == (
        ex.code,
        ex.signal,
        ex.core_dumped,
        ex.oom,
        ex.status,
    )
    assert (got.runtime, got.stopped_by_watcher) == (ex.runtime, ex.stopped_by_watcher)
    if path in ("json", "record", "file"):  # usage is not on the bus (its struct is fixed)
        assert back.usage == ex.usage
        assert got == sent.ranks[0]


@pytest.mark.parametrize("text", ENDS)
def test_status_and_wait_print_what_the_live_report_said(text: str, tmp_path: Path) -> None:
    sent = job_view(ENDS[text])
    for path in PATHS:
        view = through(path, sent, tmp_path)
        assert text in _live(view), path  # `status` of a running job's ended rank
        assert text in format_report(view.report()), path  # `wait`, `status` of an ended job
