"""Issue 22, item 1: a rank that dies at its start gate, and what a BrokenPipeError means.

Real forks and real pipes: the gate of a child that is already dead has no reader.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
from pathlib import Path

import pytest

from gpulaunch import cli
from gpulaunch.base.procs import fork_held, reap
from gpulaunch.model import Cause
from gpulaunch.supervisor.systemd import SystemdSupervisor
from gpulaunch.watcher.loop import Watcher
from tests.unit.fakes import FakeSystemd, make_job, sh


def test_releasing_a_child_that_died_at_its_gate_is_not_an_error() -> None:
    """systemd killed the held rank (an outside stop): opening its gate raised EPIPE, which
    `cli.main` took for a closed stdout (a silent 141). Its death is its pidfd's to tell."""
    child = fork_held(lambda: os._exit(0), {})
    signal.pidfd_send_signal(child.pidfd, signal.SIGTERM)
    status = reap(child.pidfd)  # dead and reaped: nobody holds the gate's read end
    child.release()
    assert child.gate is None
    assert status.signal == signal.SIGTERM
    child.close()


def test_a_broken_pipe_that_is_not_stdout_is_an_internal_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Only a closed stdout may become 141: any other EPIPE is said, with its exit code 70."""

    def broken(*args: object) -> int:
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr("gpulaunch.start.render", broken)
    with pytest.raises(SystemExit) as exited:
        cli.main(["render", "train.py"])
    assert exited.value.code == 70
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["gpulaunch: internal error: BrokenPipeError: [Errno 32] Broken pipe; "
                   "rerun with --debug and report it"], err  # fmt: skip


def test_a_closed_stdout_is_still_141(monkeypatch: pytest.MonkeyPatch) -> None:
    """What 141 is for: the reader of stdout went away (the write end polls POLLERR)."""
    read_end, write_end = os.pipe()
    with os.fdopen(write_end, "w") as stdout:
        monkeypatch.setattr(sys, "stdout", stdout)
        assert not cli._stdout_gone()  # a reader: a BrokenPipeError is not stdout's
        os.close(read_end)
        assert cli._stdout_gone()


def test_a_rank_start_job_canceled_is_a_stop_from_outside(tmp_path: Path) -> None:
    """Only a stop job replaces a start job: `systemctl stop` of the job while a rank's scope
    was being made is the README's 143 "stopped from outside", not 71 "start job ended
    'canceled'" (the fake systemd: the logic, not systemd's timing)."""
    spec, units = make_job([sh("exec sleep 60"), sh("exec sleep 60")])
    sd = FakeSystemd(start_result="canceled")
    r, w = socket.socketpair()
    with r, w:
        r.setblocking(False)
        report = Watcher(spec, SystemdSupervisor(sd, units), r.fileno(), runtime_dir=tmp_path).run()
    assert (report.status, report.cause) == (143, Cause.INTERRUPTED)
    assert report.interrupted_by == f"a stop of {units.ranks[0].name} from outside"
    assert ("stop", units.ranks_slice.name) in sd.calls
