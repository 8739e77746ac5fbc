"""Rank output when its destinations fail: a full --log-dir disk, journald stopped (issue 13)."""

from __future__ import annotations

import re

import pytest

from tests.integration.jobs import REPO, Job, wait_until
from tests.integration.shared import TALK, journal_count

pytestmark = pytest.mark.integration

PHASES = str(REPO / "tests" / "integration" / "scripts" / "phases.py")
JOURNALD_SOCKETS = (
    "systemd-journald.socket",
    "systemd-journald-dev-log.socket",
    "systemd-journald-audit.socket",
)


def test_full_log_dir_warns_once_and_loses_nothing_elsewhere(job: Job) -> None:
    log_dir = job.dir / "full"
    log_dir.mkdir()
    job.box.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(log_dir)], check=True)
    lines = 5000  # about 85 KB per rank: more than the file system holds, under journald's limit
    try:
        res = job.run(
            "--nproc", "2", "--log-dir", str(log_dir), script=TALK,
            script_args=["--lines", str(lines)],
        )  # fmt: skip
    finally:
        job.box.run(["umount", str(log_dir)])
    assert res.returncode == 0, res.stderr[-3000:]
    assert "Traceback" not in res.stderr and "Exception in callback" not in res.stderr
    warnings = [line for line in res.stderr.splitlines() if "cannot write" in line]
    assert len(warnings) == 1, res.stderr[-3000:]
    assert "No space left on device" in warnings[0] and str(log_dir) in warnings[0]
    for rank in range(2):
        shown = [line for line in res.stdout.splitlines() if line.startswith(f"[{rank}] ")]
        assert shown == [f"[{rank}] rank {rank} line {i}" for i in range(lines)]
        assert journal_count(job, job.names.rank_scope(rank)) == lines
    lacks = re.findall(
        r"rank(\d)\.log lacks rank (\d)'s lines after the first (\d+) of (\d+)", res.stderr
    )
    assert lacks and all(int(total) == lines for *_, total in lacks), res.stderr[-3000:]
    assert "--log-dir have all of them" not in res.stderr


def journald(job: Job, verb: str, *units: str) -> None:
    job.box.run(["systemctl", verb, *units], check=True)


def test_journald_stopped_and_back(job: Job) -> None:
    """Stopped alone (its sockets stay): the pump connects again. With its sockets: the
    lines written meanwhile are missing from the journal, and the report counts them."""
    proc = job.popen("--nproc", "1", script=PHASES, script_args=["--lines", "10", "--phases", "4"])
    try:
        job.wait_file("rank0.phase0")
        journald(job, "stop", "systemd-journald.service")  # the case
        (job.dir / "go0").touch()
        job.wait_file("rank0.phase1")
        unit = job.names.rank_scope(0)
        wait_until(lambda: "rank 0 phase 1 line 9" in journal_lines(job, unit), 60, "phase 1")
        journald(job, "stop", "systemd-journald.service", *JOURNALD_SOCKETS)
        (job.dir / "go1").touch()
        job.wait_file("rank0.phase2")  # written while nobody listened
        journald(job, "start", *JOURNALD_SOCKETS, "systemd-journald.service")
        (job.dir / "go2").touch()
        out, err = proc.communicate(timeout=120)
    finally:
        journald(job, "start", *JOURNALD_SOCKETS, "systemd-journald.service")
        for phase in range(3):  # a failed wait must not leave the rank waiting forever
            (job.dir / f"go{phase}").touch()
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    assert out.count("\n") == 40
    stored = journal_lines(job, job.names.rank_scope(0))
    for phase in (1, 3):  # after journald came back
        assert [f"rank 0 phase {phase} line {i}" for i in range(10)] == [
            line for line in stored if f" phase {phase} " in line
        ], stored
    missed = re.findall(r"journald missed (\d+) of rank 0's (\d+) lines", err)
    assert missed == [(str(40 - len(stored)), "40")], err
    assert 40 - len(stored) >= 10, stored  # phase 2 at least


def journal_lines(job: Job, unit: str) -> list[str]:
    out = job.box.run(
        ["journalctl", "--no-pager", "-q", "-o", "cat", f"_SYSTEMD_UNIT={unit}"],
        capture_output=True,
        check=True,
        text=True,
    ).stdout
    return out.splitlines()
