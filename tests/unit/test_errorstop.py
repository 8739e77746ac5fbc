"""What a rank's @record error file means for the job (watcher/errorwatch.py, loop._failed).

The real loop with the fake systemd of fakes.py and real children; inotify is real.
"""

from __future__ import annotations

import socket
from pathlib import Path

from gpulaunch.model import Cause
from gpulaunch.supervisor.systemd import SystemdSupervisor
from gpulaunch.watcher.errorwatch import ErrorFileWatch
from gpulaunch.watcher.loop import Watcher
from tests.unit.fakes import FakeSystemd, make_job, no_children_left, sh

# What @record does: the error file first, then a slow teardown, then the exit.
RECORDED = (
    'printf \'{"message": "boom in rank 0"}\' > "$TORCHELASTIC_ERROR_FILE"; sleep 0.6; exit 1'
)


def test_the_failing_rank_is_the_cause_as_of_its_error_file(
    wakeup: tuple[int, socket.socket], tmp_path: Path
) -> None:
    """Rank 0 raises (@record writes its file), tears down slowly; rank 1, taken down by
    it, fails first: rank 0 is still the cause, with its own exit and its own error."""
    sd = FakeSystemd()
    taken_down = "sleep 0.3; exit 9"
    spec, units = make_job([sh(RECORDED), sh(taken_down), sh("exec sleep 60")])
    report = Watcher(spec, SystemdSupervisor(sd, units), wakeup[0], runtime_dir=tmp_path).run()
    assert (report.status, report.cause, report.cause_rank) == (1, Cause.RANK_FAILED, 0)
    cause, second, third = report.ranks
    assert cause.exit is not None and cause.exit.code == 1 and not cause.exit.stopped_by_watcher
    assert cause.error == "boom in rank 0"
    assert second.exit is not None and second.exit.code == 9
    assert third.exit is not None and third.exit.stopped_by_watcher
    # The stop came at rank 0's exit, the gang as one: the file alone stopped nobody.
    assert [name for verb, name in sd.calls if verb == "stop"] == [units.ranks_slice.name]
    assert no_children_left()


def test_an_error_file_then_exit_0_stops_nothing(
    wakeup: tuple[int, socket.socket], tmp_path: Path
) -> None:
    """A rank that caught its exception (its @record wrote the file) and exits 0."""
    sd = FakeSystemd()
    caught = 'printf \'{"message": "caught"}\' > "$TORCHELASTIC_ERROR_FILE"; exit 0'
    spec, units = make_job([sh(caught), sh("sleep 0.8"), sh("sleep 0.8")])
    report = Watcher(spec, SystemdSupervisor(sd, units), wakeup[0], runtime_dir=tmp_path).run()
    assert (report.status, report.cause, report.cause_rank) == (0, Cause.SUCCEEDED, None)
    for rank in report.ranks:
        assert rank.exit is not None and rank.exit.code == 0 and rank.exit.signal is None
        assert not rank.exit.stopped_by_watcher and rank.error is None
    assert [name for verb, name in sd.calls if verb == "stop" and "rank" in name] == [
        units.ranks_slice.name
    ]
    assert no_children_left()


def test_a_sibling_s_error_file_blames_nobody(
    wakeup: tuple[int, socket.socket], tmp_path: Path
) -> None:
    """Rank 1 writes rank 0's error file (same uid), then fails: rank 1 is the cause."""
    sd = FakeSystemd()
    forger = (
        'f="$(dirname "$(dirname "$TORCHELASTIC_ERROR_FILE")")/0/error.json"; '
        'printf \'{"message": "forged"}\' > "$f"; sleep 0.2; exit 5'
    )
    spec, units = make_job([sh("exec sleep 60"), sh(forger), sh("exec sleep 60")])
    report = Watcher(spec, SystemdSupervisor(sd, units), wakeup[0], runtime_dir=tmp_path).run()
    assert (report.status, report.cause, report.cause_rank) == (5, Cause.RANK_FAILED, 1)
    innocent = report.ranks[0]
    assert innocent.exit is not None and innocent.exit.stopped_by_watcher
    assert innocent.error is None
    assert no_children_left()


def test_a_rank_whose_error_file_came_first_is_awaited_at_most_the_grace(
    wakeup: tuple[int, socket.socket], tmp_path: Path
) -> None:
    """A rank fails while one that wrote its error file still runs (and never exits by
    itself): the gang stop waits for it --grace (1 s), then it is stopped, not blamed."""
    sd = FakeSystemd()
    hangs = 'printf \'{"message": "x"}\' > "$TORCHELASTIC_ERROR_FILE"; exec sleep 60'
    spec, units = make_job([sh(hangs), sh("sleep 0.3; exit 6")])  # grace_sec=1.0
    report = Watcher(spec, SystemdSupervisor(sd, units), wakeup[0], runtime_dir=tmp_path).run()
    assert (report.status, report.cause, report.cause_rank) == (6, Cause.RANK_FAILED, 1)
    waited = report.ranks[0]
    assert waited.exit is not None and waited.exit.stopped_by_watcher
    assert waited.exit.runtime >= 1.0 + 0.3  # its file, then the failure, then the grace
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
