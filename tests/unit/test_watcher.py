"""The watcher's loop with a hand-written fake of the systemd interface and real children.

The fake stands in for systemd only: jobs finish at once and "stopping" the
ranks slice sends SIGTERM to the rank processes, as systemd would. The ranks
are real short-lived processes, reaped through real pidfds.
"""

from __future__ import annotations

import os
import signal
import socket
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path

import pytest

from gpulaunch.errors import (
    JobExistsError,
    StoppedWhileStartingError,
    SystemdError,
    UnavailableError,
)
from gpulaunch.model import Cause, JobProgress, JobReport, Manager
from gpulaunch.parts import Part
from gpulaunch.supervisor.systemd import SystemdSupervisor
from gpulaunch.supervisor.systemd_api import (
    ConnectionLost,
    JobDone,
    JobQueued,
    UnitState,
)
from gpulaunch.units.codec import Property
from gpulaunch.watcher.errorfile import runtime_base
from gpulaunch.watcher.loop import Watcher
from gpulaunch.watcher.settle import LEFTOVER_S, Settle
from tests.unit.fakes import _BEFORE, FakeSystemd, children, make_job, no_children_left, sh


@pytest.fixture(autouse=True)
def _children_before() -> None:
    _BEFORE.clear()
    _BEFORE.update(children())


def test_all_succeed(wakeup: tuple[int, socket.socket], tmp_path: Path) -> None:
    sd = FakeSystemd()
    spec, units = make_job([sh("exit 0"), sh("exit 0")])
    report = Watcher(spec, SystemdSupervisor(sd, units), wakeup[0], runtime_dir=tmp_path).run()
    assert report.status == 0 and report.cause is Cause.SUCCEEDED
    assert [r.exit.code for r in report.ranks if r.exit] == [0, 0]
    # the ranks slice is stopped at the end even on success (leftover grandchildren)
    assert ("stop", units.ranks_slice.name) in sd.calls
    # the job slice comes with the anchor, in one call (supervisor/anchor.py)
    assert [c for c in sd.calls if c[0] in ("start", "aux")][:4] == [
        ("start", spec.names.anchor_service),
        ("aux", units.job_slice.name),
        ("start", units.watcher.name),
        ("start", units.ranks_slice.name),
    ]
    assert no_children_left()


def test_first_failure_stops_the_gang(wakeup: tuple[int, socket.socket], tmp_path: Path) -> None:
    sd = FakeSystemd()
    spec, units = make_job([sh("exec sleep 60"), sh("exit 3"), sh("exec sleep 60")])
    report = Watcher(spec, SystemdSupervisor(sd, units), wakeup[0], runtime_dir=tmp_path).run()
    assert (report.status, report.cause, report.cause_rank) == (3, Cause.RANK_FAILED, 1)
    stopped = [r for r in report.ranks if r.rank != 1]
    assert all(
        r.exit and r.exit.signal == signal.SIGTERM and r.exit.stopped_by_watcher for r in stopped
    )
    assert no_children_left()


def test_early_success_is_not_a_failure(wakeup: tuple[int, socket.socket], tmp_path: Path) -> None:
    sd = FakeSystemd()
    spec, units = make_job([sh("exit 0"), sh("sleep 0.3; exit 0")])
    report = Watcher(spec, SystemdSupervisor(sd, units), wakeup[0], runtime_dir=tmp_path).run()
    assert report.status == 0


def test_rank_killed_by_signal(wakeup: tuple[int, socket.socket], tmp_path: Path) -> None:
    sd = FakeSystemd()
    spec, units = make_job([sh("kill -KILL $$"), sh("exec sleep 60")])
    report = Watcher(spec, SystemdSupervisor(sd, units), wakeup[0], runtime_dir=tmp_path).run()
    assert (report.status, report.cause_rank) == (137, 0)


def test_interrupt_stops_with_128_plus_n(wakeup: tuple[int, socket.socket], tmp_path: Path) -> None:
    sd = FakeSystemd()
    spec, units = make_job([sh("exec sleep 60"), sh("exec sleep 60")])
    wakeup[1].send(bytes([signal.SIGTERM]))
    report = Watcher(spec, SystemdSupervisor(sd, units), wakeup[0], runtime_dir=tmp_path).run()
    assert (report.status, report.cause) == (143, Cause.INTERRUPTED)
    assert all(r.exit is None or r.exit.stopped_by_watcher for r in report.ranks)
    assert no_children_left()


def test_second_interrupt_kills(wakeup: tuple[int, socket.socket], tmp_path: Path) -> None:
    sd = FakeSystemd()
    spec, units = make_job([sh("trap '' TERM; sleep 60 & wait; sleep 60")])
    wakeup[1].send(bytes([signal.SIGINT, signal.SIGINT]))
    report = Watcher(spec, SystemdSupervisor(sd, units), wakeup[0], runtime_dir=tmp_path).run()
    assert report.status == 130
    assert ("kill", units.ranks[0].name) in sd.calls


class OutsideStop(FakeSystemd):
    """`systemctl stop` of the job slice: its JobNew lags behind the ranks' deaths."""

    def start_transient(
        self,
        name: str,
        properties: Sequence[Property],
        pids: Sequence[int] = (),
        aux: Sequence[tuple[str, Sequence[Property]]] = (),
    ) -> str:
        path = super().start_transient(name, properties, pids, aux)
        if name.endswith("-rank1.scope"):
            threading.Timer(0.3, self.stop_from_outside, args=(name,)).start()
        return path

    def stop_from_outside(self, rank1: str) -> None:
        job_slice = rank1.replace("-rank1.scope", ".slice")
        self.queue.append(JobQueued("/org/freedesktop/systemd1/job/outside", job_slice))
        for unit, pids in list(self.units.items()):  # no wake-up: the bus is slower
            if "-rank" in unit:
                for pid in pids:
                    os.kill(pid, signal.SIGTERM)


def test_stop_from_outside_is_an_interrupt(
    wakeup: tuple[int, socket.socket], tmp_path: Path
) -> None:
    sd = OutsideStop()
    spec, units = make_job([sh("exec sleep 60"), sh("exec sleep 60")])
    report = Watcher(spec, SystemdSupervisor(sd, units), wakeup[0], runtime_dir=tmp_path).run()
    assert (report.status, report.cause, report.cause_rank) == (143, Cause.INTERRUPTED, None)
    assert report.interrupted_by == f"a stop of {units.job_slice.name} from outside"
    assert all(r.exit is not None and r.exit.stopped_by_watcher for r in report.ranks)
    assert no_children_left()


def test_job_exists(wakeup: tuple[int, socket.socket], tmp_path: Path) -> None:
    sd = FakeSystemd()
    spec, units = make_job([sh("exit 0")])
    sd.units[units.job_slice.name] = []
    with pytest.raises(JobExistsError, match="already running"):
        Watcher(spec, SystemdSupervisor(sd, units), wakeup[0], runtime_dir=tmp_path).run()


def test_partial_start_is_undone(wakeup: tuple[int, socket.socket], tmp_path: Path) -> None:
    spec, units = make_job([sh("exec sleep 60"), sh("exec sleep 60"), sh("exec sleep 60")])
    sd = FakeSystemd(fail_start=units.ranks[1].name)
    with pytest.raises(SystemdError):
        Watcher(spec, SystemdSupervisor(sd, units), wakeup[0], runtime_dir=tmp_path).run()
    assert ("stop", units.ranks_slice.name) in sd.calls
    assert no_children_left()


def test_failed_start_job_kills_held_ranks(
    wakeup: tuple[int, socket.socket], tmp_path: Path
) -> None:
    spec, units = make_job([sh("exec sleep 60"), sh("exec sleep 60")])
    sd = FakeSystemd(start_result="failed")
    with pytest.raises(SystemdError, match="failed"):
        Watcher(spec, SystemdSupervisor(sd, units), wakeup[0], runtime_dir=tmp_path).run()
    assert no_children_left()


def test_restart_after_a_failure_on_the_first_attempt(
    wakeup: tuple[int, socket.socket], tmp_path: Path
) -> None:
    fail_first = sh('[ "$TORCHELASTIC_RESTART_COUNT" = 0 ] && exit 5; exit 0')
    spec, units = make_job([sh("exec sleep 1"), fail_first], max_restarts=2)
    sd = FakeSystemd()
    report = Watcher(spec, SystemdSupervisor(sd, units), wakeup[0], runtime_dir=tmp_path).run()
    assert (report.status, report.restarts) == (0, 1)
    assert sd.calls.count(("start", units.ranks_slice.name)) == 2
    assert no_children_left()


def test_restarts_run_out(wakeup: tuple[int, socket.socket], tmp_path: Path) -> None:
    spec, units = make_job([sh("exit 0"), sh("exit 5")], max_restarts=2)
    report = Watcher(
        spec, SystemdSupervisor(FakeSystemd(), units), wakeup[0], runtime_dir=tmp_path
    ).run()
    assert (report.status, report.restarts, report.cause_rank) == (5, 2, 1)


def test_cause_rank_error_from_error_file_or_stderr(
    wakeup: tuple[int, socket.socket], tmp_path: Path
) -> None:
    record = sh(
        'printf \'{"message": {"message": "ValueError: x", "extraInfo": '
        '{"py_callstack": "Traceback (most recent call last):\\\\nValueError: x"}}}\' '
        '> "$TORCHELASTIC_ERROR_FILE"; exit 1'
    )
    spec, units = make_job([record, sh("exec sleep 60")])
    report = Watcher(
        spec, SystemdSupervisor(FakeSystemd(), units), wakeup[0], runtime_dir=tmp_path
    ).run()
    cause = report.ranks[0]
    assert cause.error == "Traceback (most recent call last):\nValueError: x"
    assert cause.error_source is not None and "error file" in cause.error_source
    assert report.ranks[1].error is None
    spec, units = make_job([sh("echo one >&2; echo two >&2; exit 2")], job="u")
    report = Watcher(
        spec, SystemdSupervisor(FakeSystemd(), units), wakeup[0], runtime_dir=tmp_path
    ).run()
    assert report.ranks[0].error == "one\ntwo"
    assert list(tmp_path.joinpath("gpulaunch").iterdir()) == []  # error files cleaned up


class SignalDuringStart(FakeSystemd):
    """Sends SIGTERM to the watcher (through its wakeup fd) when rank `at` is placed."""

    def __init__(self, wakeup: socket.socket, at: int) -> None:
        super().__init__()
        self.wakeup, self.at = wakeup, at

    def start_transient(
        self,
        name: str,
        properties: Sequence[Property],
        pids: Sequence[int] = (),
        aux: Sequence[tuple[str, Sequence[Property]]] = (),
    ) -> str:
        if name.endswith(f"-rank{self.at}.scope"):
            self.wakeup.send(bytes([signal.SIGTERM]))
        return super().start_transient(name, properties, pids, aux)


def test_sigterm_while_ranks_are_forked_stops_forking(
    wakeup: tuple[int, socket.socket], tmp_path: Path
) -> None:
    """A big job is not forked to its end before a SIGTERM is heard (issue 13, item 10)."""
    sd = SignalDuringStart(wakeup[1], at=2)
    spec, units = make_job([sh("exec sleep 60")] * 40)
    report = Watcher(spec, SystemdSupervisor(sd, units), wakeup[0], runtime_dir=tmp_path).run()
    assert (report.status, report.cause) == (143, Cause.INTERRUPTED)
    started = [name for call, name in sd.calls if call == "start" and name.endswith(".scope")]
    started = [name for name in started if "-rank" in name and "-ranks" not in name]
    assert len(started) == 3, started
    assert sum(r.pid is not None for r in report.ranks) == 3
    assert no_children_left()


def test_an_ordinary_users_error_files_never_go_to_a_shared_tmp_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without XDG_RUNTIME_DIR: <tmp>/gpulaunch-<uid>, private; someone else's is refused."""
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    tempfile.tempdir = None  # gettempdir() reads TMPDIR again
    try:
        base = runtime_base(Manager.USER)
        assert base == tmp_path / f"gpulaunch-{os.getuid()}"
        assert base.stat().st_mode & 0o777 == 0o700
        base.chmod(0o777)
        with pytest.raises(UnavailableError, match="not a private directory of yours"):
            runtime_base(Manager.USER)
    finally:
        tempfile.tempdir = None


def test_settle_waits_for_the_pumps_and_briefly_for_a_last_chunk() -> None:
    """A stream open right after the last rank ended is a pump's last chunk, not a leftover."""
    s = Settle(grace=10.0)
    assert s.wait(100.0, streams_open=True, pumps_done=False) == (LEFTOVER_S, True)
    assert s.wait(100.5, streams_open=False, pumps_done=False) == (10.0, True)  # draining
    assert s.wait(105.5, streams_open=False, pumps_done=False) == (5.0, False)
    assert s.wait(110.5, streams_open=False, pumps_done=False) is None  # after the grace
    held = Settle(grace=10.0)
    held.wait(0.0, streams_open=True, pumps_done=False)
    assert held.wait(LEFTOVER_S, streams_open=True, pumps_done=False) is None  # a leftover
    assert Settle(grace=10.0).wait(0.0, streams_open=False, pumps_done=True) is None


class ReexecDuringCreate(FakeSystemd):
    """The connection drops during the StartTransientUnit of `at` (a user manager's
    daemon-reexec): after systemd made the unit (`made`), or before the call reached it.
    What was queued on the old connection is lost with it."""

    def __init__(self, at: str, made: bool, pending: bool = False) -> None:
        super().__init__()
        self.at, self.made, self.pending = at, made, pending
        self.lost = False
        self.reconnects = 0

    def start_transient(
        self,
        name: str,
        properties: Sequence[Property],
        pids: Sequence[int] = (),
        aux: Sequence[tuple[str, Sequence[Property]]] = (),
    ) -> str:
        if name.endswith(self.at) and not self.lost:
            self.lost = True
            if self.made:
                path = super().start_transient(name, properties, pids, aux)
                if self.pending:  # its start job still runs: JobRemoved on the new connection
                    self.queue = [JobDone(path, name, "done")]
                    self.job = path
            raise ConnectionLost("create: Connection reset by peer")
        return super().start_transient(name, properties, pids, aux)

    def reconnect(self) -> None:
        self.reconnects += 1
        if not self.pending:
            self.queue = []

    def unit_state(self, name: str) -> UnitState:
        if self.pending and name.endswith(self.at):
            return UnitState("inactive", True, self.job)
        return super().unit_state(name)


@pytest.mark.parametrize(
    ("at", "made", "pending"),
    [
        ("-rank0.scope", True, False),
        ("-rank0.scope", False, False),
        ("-rank0.scope", True, True),
        (".service", True, False),  # the anchor, with the job slice
        (".service", False, False),
    ],
)
def test_connection_lost_while_creating_carries_on(
    wakeup: tuple[int, socket.socket], tmp_path: Path, at: str, made: bool, pending: bool
) -> None:
    """A daemon-reexec during a create call: the job's own end, never 71 (issue 22's soak)."""
    sd = ReexecDuringCreate(at, made, pending)
    spec, units = make_job([sh("exit 7")])
    report = Watcher(spec, SystemdSupervisor(sd, units), wakeup[0], runtime_dir=tmp_path).run()
    assert (report.status, report.cause, report.cause_rank) == (7, Cause.RANK_FAILED, 0)
    assert sd.lost and sd.reconnects == 1
    starts = [name for call, name in sd.calls if call == "start" and name.endswith(at)]
    assert len(starts) == 1, sd.calls  # made once: asked again only where it was not
    assert no_children_left()


class StopAtStart(FakeSystemd):
    """`systemctl stop` of the job slice just after the anchor's call made it (the soak's
    stop-at-start): `done` it ended before the watcher scope's call (which starts the slice
    again); else that call is refused, as a "destructive" transaction."""

    def __init__(self, done: bool) -> None:
        super().__init__()
        self.done = done

    def start_transient(
        self,
        name: str,
        properties: Sequence[Property],
        pids: Sequence[int] = (),
        aux: Sequence[tuple[str, Sequence[Property]]] = (),
    ) -> str:
        if name.endswith("-watcher.scope"):
            job_slice = name.replace("-watcher.scope", ".slice")
            if not self.done:
                raise StoppedWhileStartingError(
                    f"the job was stopped from outside while it started ({name}: destructive)"
                )
            for unit in [u for u in self.units if u.endswith("-anchor.service")]:
                del self.units[unit]  # stopped with its slice, and collected
            outside = "/org/freedesktop/systemd1/job/outside"
            self.queue += [JobQueued(outside, job_slice), JobDone(outside, job_slice, "done")]
        return super().start_transient(name, properties, pids, aux)


class Finishes(Part):
    """Records what the job's parts are told at the end (the journal record's)."""

    def __init__(self) -> None:
        self.reports: list[JobReport] = []

    async def finished(self, progress: JobProgress, report: JobReport) -> None:
        self.reports.append(report)


@pytest.mark.parametrize("done", [True, False])
def test_stop_of_the_job_while_its_units_are_made_is_an_interrupt(
    wakeup: tuple[int, socket.socket], tmp_path: Path, done: bool
) -> None:
    """Never lost (the job ran its 30 s and exited 0), never without its record (issue 22's
    soak: "no journal record" after one line and 143)."""
    sd = StopAtStart(done)
    spec, units = make_job([sh("exit 0")])
    seen = Finishes()
    watcher = Watcher(
        spec, SystemdSupervisor(sd, units), wakeup[0], runtime_dir=tmp_path, parts=[seen]
    )
    report = watcher.run()
    assert (report.status, report.cause) == (143, Cause.INTERRUPTED)
    assert report.interrupted_by == f"a stop of {units.job_slice.name} from outside"
    assert seen.reports == [report]
    assert not [name for call, name in sd.calls if call == "start" and "-rank0" in name]
    assert no_children_left()
