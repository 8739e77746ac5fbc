"""The job API's pure parts: bus names, the record's fields, the shipped interface and
policy, and --detach's start pipe (real forks, no systemd)."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import struct
import threading
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from dbus_fast import Variant
from dbus_fast.introspection import Node
from dbus_fast.validators import is_bus_name_valid, is_object_path_valid

from gpulaunch.base.detach import Detached, tail_overlap
from gpulaunch.errors import UnavailableError
from gpulaunch.jobapi import record
from gpulaunch.jobapi.interface import (
    FINISHED_SIGNATURE,
    RANK_EXITED_SIGNATURE,
    interface_xml,
)
from gpulaunch.jobapi.rankview import RankView
from gpulaunch.jobapi.record import Recorder
from gpulaunch.jobapi.view import (
    INTERFACE,
    JobState,
    JobView,
    bus_label,
    bus_name,
    is_job_name,
    object_path,
)
from gpulaunch.model import Cause
from gpulaunch.supervisor.systemd import SystemdSupervisor
from gpulaunch.system.files import BUS_POLICY
from gpulaunch.watcher.loop import Watcher
from tests.unit.fakes import FakeSystemd, decode, make_job, sh
from tests.unit.fakes import job_view as view

ODD_IDS = [
    "t1",
    "a-b",
    "a_2db",
    "a/b",
    "a b",
    "1job",
    "_",
    ".x",
    "ünïcødé-名前",
    "a\\x2db",
    "x" * 300,
    "x" * 299 + "y",
    "-" * 200,
]


@pytest.mark.parametrize("job", ODD_IDS)
def test_bus_names_are_valid(job: str) -> None:
    assert is_bus_name_valid(bus_name(job)) and len(bus_name(job)) <= 255
    assert is_object_path_valid(object_path(job))
    assert is_job_name(bus_name(job))


def test_bus_label_escaping() -> None:
    assert bus_label("t1") == "t1"
    assert bus_label("a-b") == "a_2db"
    assert bus_label("a_2db") == "a_5f2db"  # `_` is escaped: no collision with the above
    assert bus_label("1job") == "_31job"  # a bus name element must not begin with a digit
    assert bus_label("é") == "_c3_a9"
    assert len({bus_label(j) for j in ODD_IDS}) == len(ODD_IDS)


def test_long_ids_are_hashed() -> None:
    a, b = bus_label("x" * 300), bus_label("x" * 299 + "y")
    assert a != b and re.fullmatch(r"x+_h[0-9a-f]{32}", a)
    dashes = bus_label("-" * 200)
    assert re.fullmatch(r"(_2d)+_h[0-9a-f]{32}", dashes)  # no escape cut in half


def test_properties_match_the_shipped_interface() -> None:
    node = Node.parse(interface_xml())
    (iface,) = [i for i in node.interfaces if i.name == INTERFACE]
    props = view().properties()
    assert {p.name: p.signature for p in iface.properties} == {k: v[0] for k, v in props.items()}
    assert all(p.access.value == "read" for p in iface.properties)
    signals = {s.name: "".join(a.signature for a in s.args) for s in iface.signals}
    assert signals == {"RankExited": RANK_EXITED_SIGNATURE, "Finished": FINISHED_SIGNATURE}
    assert [m.name for m in iface.methods] == ["Stop", "Signal"]
    for sig, value in props.values():  # every value fits its signature
        Variant(sig, value)


def test_properties_round_trip() -> None:
    v = view()
    back = JobView.from_properties({k: value for k, (_, value) in v.properties().items()})
    assert back == v


def test_policy_lets_root_own_and_anyone_call() -> None:
    root = ET.parse(BUS_POLICY.source).getroot()  # what `gpulaunch setup` installs
    owners = [a.get("own_prefix") for p in root if p.get("user") == "root" for a in p]
    assert owners == ["io.gpulaunch.job"]
    default = next(p for p in root if p.get("context") == "default")
    interfaces = {a.get("send_interface") for a in default}
    assert INTERFACE in interfaces and "org.freedesktop.DBus.Properties" in interfaces
    assert {a.get("send_destination_prefix") for a in default} == {"io.gpulaunch.job"}


# -- the record ------------------------------------------------------------------


def test_record_fields_round_trip() -> None:
    v = view(error="", cause_error="Traceback\n  boom\nValueError: x", cause_error_source="stderr")
    entry = decode(record.encode(record.fields(v, "job j failed")))
    assert entry["MESSAGE_ID"] == record.MESSAGE_ID and entry["PRIORITY"] == "3"
    assert entry["GPULAUNCH_STATUS"] == "7" and entry["GPULAUNCH_CAUSE_RANK"] == "1"
    assert json.loads(entry["GPULAUNCH_RANKS"])[1]["exit_code"] == 7
    entry.update({"_UID": "0", "__REALTIME_TIMESTAMP": "1700000000000000"})
    back = record.parse(entry)
    assert back == view(
        cause_error=v.cause_error, cause_error_source="stderr", ended_at=1700000000000000
    )
    report = back.report()
    assert (report.status, report.cause, report.cause_rank) == (7, Cause.RANK_FAILED, 1)
    assert report.ranks[1].error == v.cause_error


def test_record_of_a_success_omits_the_cause_rank() -> None:
    ok = view(state=JobState.SUCCEEDED, status=0, cause="succeeded", cause_rank=-1)
    entry = decode(record.encode(record.fields(ok, "ok")))
    assert "GPULAUNCH_CAUSE_RANK" not in entry and entry["PRIORITY"] == "6"


@pytest.mark.parametrize(
    ("cause", "status", "state"),
    [
        (Cause.SUCCEEDED, 0, JobState.SUCCEEDED),
        (Cause.RANK_FAILED, 7, JobState.FAILED),
        (Cause.START_FAILED, 71, JobState.FAILED),
        (Cause.NODE_FAILED, 75, JobState.FAILED),
        (Cause.INTERRUPTED, 143, JobState.STOPPED),  # gpulaunch stop
        (Cause.INTERRUPTED, 130, JobState.STOPPED),  # Ctrl-C
    ],
)
def test_one_word_for_how_a_job_ended(cause: Cause, status: int, state: JobState) -> None:
    assert JobState.of_cause(cause, status) is state and state.ended


def test_a_stopped_jobs_record_says_stopped_even_if_written_as_failed() -> None:
    stopped = view(state=JobState.STOPPED, status=143, cause="interrupted", cause_rank=-1)
    entry = decode(record.encode(record.fields(stopped, "stopped")))
    assert (entry["GPULAUNCH_STATE"], entry["PRIORITY"]) == ("stopped", "5")
    entry.update({"_UID": "0", "GPULAUNCH_STATE": "failed"})  # as records before said
    assert record.parse(entry).state is JobState.STOPPED
    assert record.parse(entry).to_json()["state"] == "stopped"


def test_parse_rejects_other_entries() -> None:
    with pytest.raises(ValueError):
        record.parse({"MESSAGE_ID": "00"})
    with pytest.raises(ValueError, match="malformed"):
        record.parse({"MESSAGE_ID": record.MESSAGE_ID, "GPULAUNCH_JOB": "x"})


@pytest.mark.parametrize("size", [100, 400_000])
def test_send_small_and_big_entries(tmp_path: Path, size: int) -> None:
    """Big entries go as a sealed memfd, as journald accepts them."""
    path = str(tmp_path / "socket")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as server:
        server.bind(path)
        data = record.encode([("MESSAGE", "x" * size)])
        record.send(data, path)
        msg, ancdata, _, _ = server.recvmsg(size + 1024, socket.CMSG_SPACE(4))
        if msg:
            assert msg == data
        else:
            (fd,) = struct.unpack("i", ancdata[0][2])
            try:
                assert os.pread(fd, len(data) + 1, 0) == data
            finally:
                os.close(fd)


def test_recorder_writes_the_watchers_report(tmp_path: Path) -> None:
    sent: list[bytes] = []
    spec, units = make_job([sh("exec sleep 60"), sh("exit 3")], job="rec")
    r, w = socket.socketpair()
    with r, w:
        report = Watcher(
            spec,
            SystemdSupervisor(FakeSystemd(), units),
            r.fileno(),
            parts=[Recorder(send=sent.append)],
            runtime_dir=tmp_path,
        ).run()
    assert report.status == 3
    (data,) = sent
    entry = decode(data)
    assert entry["GPULAUNCH_JOB"] == "rec" and entry["GPULAUNCH_STATE"] == "failed"
    assert (entry["GPULAUNCH_STATUS"], entry["GPULAUNCH_CAUSE_RANK"]) == ("3", "1")
    ranks = json.loads(entry["GPULAUNCH_RANKS"])
    assert [(x["state"], x["stopped_by_watcher"]) for x in ranks] == [
        ("stopped", True),
        ("exited", False),
    ]


def test_a_failed_start_is_recorded_too(tmp_path: Path) -> None:
    sent: list[bytes] = []
    spec, units = make_job([sh("exec sleep 60")], job="nostart")
    r, w = socket.socketpair()
    with r, w, pytest.raises(Exception, match="failed"):
        Watcher(
            spec,
            SystemdSupervisor(FakeSystemd(start_result="failed"), units),
            r.fileno(),
            parts=[Recorder(send=sent.append)],
            runtime_dir=tmp_path,
        ).run()
    entry = decode(sent[0])
    assert entry["GPULAUNCH_CAUSE"] == "start-failed" and entry["GPULAUNCH_STATUS"] == "71"
    assert "could not start" in entry["GPULAUNCH_ERROR"]


# -- --detach ----------------------------------------------------------------------


def run_detached(child: str, capfd: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """Fork like `start --detach`; the child does `child` (started or fail).

    The child writes to fd 2 itself: under pytest, sys.stderr is not fd 2.
    """
    detached = Detached.fork()
    if not detached.is_parent:  # pragma: no cover - the child
        try:
            os.write(2, b"gpulaunch: job x: 1 ranks\n")
            if child == "started":
                detached.started()
                os.write(2, b"after detaching\n")  # to /dev/null
                os._exit(0)
            os.write(2, b"gpulaunch: error: it broke; fix it\n")
            os._exit(73)
        finally:
            os._exit(70)
    code = detached.wait_started("job-x")
    if code == 0:  # the child runs on (`gpulaunch` would exit here): reap it
        os.waitpid(detached.pid, 0)
    out, err = capfd.readouterr()
    return code, out, err


def test_detach_prints_the_job_id_once_started(capfd: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_detached("started", capfd)
    assert (code, out) == (0, "job-x\n")
    assert err == "gpulaunch: job x: 1 ranks\n"


def test_detach_passes_on_a_failed_start(capfd: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_detached("fail", capfd)
    assert (code, out) == (73, "")
    assert err == "gpulaunch: job x: 1 ranks\ngpulaunch: error: it broke; fix it\n"


def test_a_sigterm_to_the_detach_parent_ends_only_its_wait(
    capfd: pytest.CaptureFixture[str],
) -> None:
    """128+N and nothing said: not __main__.py's "before the job started" (the child, in its
    own session, may be making the job's units)."""

    def heard(signum: int, frame: object) -> None:  # (without the wait's: pytest lives on)
        pass

    pytests = signal.signal(signal.SIGTERM, heard)
    try:
        detached = Detached.fork()
        if not detached.is_parent:  # pragma: no cover - the child
            try:
                time.sleep(5)
            finally:
                os._exit(0)
        threading.Timer(0.2, os.kill, args=(os.getpid(), signal.SIGTERM)).start()
        try:
            code = detached.wait_started("job-x")
        finally:
            os.kill(detached.pid, signal.SIGKILL)
            os.waitpid(detached.pid, 0)
        before = signal.getsignal(signal.SIGTERM)
    finally:
        signal.signal(signal.SIGTERM, pytests)
    assert code == 128 + signal.SIGTERM
    assert before is heard  # the wait's handler is gone with it
    assert capfd.readouterr() == ("", "")


def test_marker_split_across_reads_is_held_back() -> None:
    marker = b"\0gpulaunch-started\n"
    assert tail_overlap(b"text\0gpulaunch-st", marker) == len(b"\0gpulaunch-st")
    assert tail_overlap(b"text", marker) == 0


def test_records_without_journalctl_is_the_machines_problem(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No journalctl on PATH: exit 69 with what to install, never an internal error."""
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(UnavailableError, match="journalctl not found") as exc:
        record.query(["MESSAGE_ID=x"], 1)
    assert exc.value.exit_code == 69


def test_json_says_null_for_what_a_running_rank_does_not_have_yet() -> None:
    running = RankView(0, 0, "gpulaunch-j-rank0.scope", 10, "running", -1, 0, False, -1, 0.0)
    pending = RankView(1, 1, "gpulaunch-j-rank1.scope", 0, "pending", -1, 0, False, -1, 0.0)
    killed = RankView(2, 2, "gpulaunch-j-rank2.scope", 12, "stopped", -1, 9, True, 137, 1.5)
    as_json = view(ranks=(running, pending, killed), state=JobState.RUNNING).to_json()["ranks"]
    assert [
        (r["pid"], r["exit_code"], r["signal"], r["status"], r["runtime"]) for r in as_json
    ] == [
        (10, None, None, None, None),
        (None, None, None, None, None),
        (12, None, 9, 137, 1.5),
    ]
    assert [RankView.from_json(r) for r in as_json] == [running, pending, killed]
