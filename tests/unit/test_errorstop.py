"""The gang stop at the moment a rank's @record writes its error file (watcher/errorwatch.py).

The real loop with the fake systemd of test_watcher.py and real children; inotify is real.
"""

from __future__ import annotations

import signal
import socket
from pathlib import Path

from gpulaunch.model import Cause
from gpulaunch.supervisor.systemd import SystemdSupervisor
from gpulaunch.watcher.errorwatch import ErrorFileWatch
from gpulaunch.watcher.loop import Watcher
from tests.unit.test_watcher import FakeSystemd, make_job, no_children_left, sh, wakeup

__all__ = ["wakeup"]  # the fixture

# What @record does: the error file first, then a slow teardown, then the exit.
RECORDED = (
    'printf \'{"message": "boom in rank 0"}\' > "$TORCHELASTIC_ERROR_FILE"; sleep 0.6; exit 1'
)


def test_the_others_stop_before_the_failing_rank_exits(
    wakeup: tuple[int, socket.socket], tmp_path: Path
) -> None:
    sd = FakeSystemd()
    spec, units = make_job([sh(RECORDED), sh("exec sleep 60"), sh("exec sleep 60")])
    report = Watcher(spec, SystemdSupervisor(sd, units), wakeup[0], runtime_dir=tmp_path).run()
    assert (report.status, report.cause, report.cause_rank) == (1, Cause.RANK_FAILED, 0)
    cause, *others = report.ranks
    assert cause.exit is not None and cause.exit.code == 1 and not cause.exit.stopped_by_watcher
    assert cause.error == "boom in rank 0"
    # Each other rank's own scope was stopped, before the ranks slice (at rank 0's exit).
    stops = [name for verb, name in sd.calls if verb == "stop"]
    assert stops == [units.ranks[1].name, units.ranks[2].name, units.ranks_slice.name]
    for other in others:
        assert other.exit is not None and other.exit.signal == signal.SIGTERM
        assert other.exit.stopped_by_watcher
        # gone while rank 0 still tore down (0.6 s after its error file; the grace is 1 s)
        assert other.exit.runtime < cause.exit.runtime
    assert no_children_left()


def test_without_an_error_file_the_stop_comes_at_the_exit(
    wakeup: tuple[int, socket.socket], tmp_path: Path
) -> None:
    sd = FakeSystemd()
    spec, units = make_job([sh("sleep 0.2; exit 4"), sh("exec sleep 60")])
    report = Watcher(spec, SystemdSupervisor(sd, units), wakeup[0], runtime_dir=tmp_path).run()
    assert (report.status, report.cause_rank) == (4, 0)
    assert [name for verb, name in sd.calls if verb == "stop"] == [units.ranks_slice.name]


def test_a_rank_that_hangs_after_its_error_file_is_stopped_after_the_grace(
    wakeup: tuple[int, socket.socket], tmp_path: Path
) -> None:
    sd = FakeSystemd()
    hangs = 'printf \'{"message": "x"}\' > "$TORCHELASTIC_ERROR_FILE"; exec sleep 60'
    spec, units = make_job([sh(hangs), sh("exec sleep 60")])  # grace_sec=1.0
    report = Watcher(spec, SystemdSupervisor(sd, units), wakeup[0], runtime_dir=tmp_path).run()
    # Still the cause (its error came first), though the gang stop ended it.
    assert (report.status, report.cause, report.cause_rank) == (143, Cause.RANK_FAILED, 0)
    assert no_children_left()


def test_inotify_events_name_the_rank_and_attempt(tmp_path: Path) -> None:
    with ErrorFileWatch() as watch:
        for rank in (0, 1):
            (tmp_path / str(rank)).mkdir()
            watch.add(tmp_path / str(rank), 3, rank)
        (tmp_path / "1" / "other.txt").write_text("x")
        assert watch.read() == []
        (tmp_path / "1" / "error.json").write_text("{}")
        (tmp_path / "0" / "tmp").write_text("{}")
        (tmp_path / "0" / "tmp").rename(tmp_path / "0" / "error.json")
        assert watch.read() == [(3, 1), (3, 0)]
