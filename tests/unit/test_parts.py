"""A job's parts (gpulaunch/parts.py): the watcher calls them at the documented points, in
order; the GPU part's check before each restart (once a mixin of every supervisor) ends
the job as a failed start does. End to end: tests/unit/test_gpu_health.py's restart."""

from __future__ import annotations

import asyncio
import os
import socket
from pathlib import Path

import pytest

from gpulaunch.errors import UnavailableError
from gpulaunch.leases.part import GpuPart
from gpulaunch.leases.store import Lease
from gpulaunch.model import JobProgress, JobReport, RankProgress, RankSpec
from gpulaunch.parts import Controls, Part, Parts, RankSetup
from gpulaunch.supervisor.systemd import SystemdSupervisor
from gpulaunch.watcher.loop import Watcher
from tests.unit.fakes import _BEFORE, FakeSystemd, children, make_job, no_children_left, sh


@pytest.fixture(autouse=True)
def _children_before() -> None:
    _BEFORE.clear()
    _BEFORE.update(children())


class Gate:
    """The health gate's one call the part makes between attempts (pure logic here)."""

    def __init__(self, unfit: bool = False) -> None:
        self.checks = 0
        self.unfit = unfit

    def check(self) -> None:
        self.checks += 1
        if self.unfit:
            raise UnavailableError("GPU 1 is not fit for the job: XID 79 reported")


def test_the_gpu_part_checks_every_attempt_but_the_first() -> None:
    spec, _ = make_job([sh("exit 0")])
    gate = Gate()
    part = GpuPart(spec, None, gate)  # type: ignore[arg-type]
    part.before_attempt(0)  # the first attempt: checked before the job started (start.py)
    assert gate.checks == 0
    part.before_attempt(1)
    part.before_attempt(2)
    assert gate.checks == 2


def test_the_gates_error_reaches_the_watcher_and_no_gate_is_no_check() -> None:
    spec, _ = make_job([sh("exit 0")])
    part = GpuPart(spec, None, None)
    part.before_attempt(0)
    part.before_attempt(1)  # no GPU or no NVML: nothing to check
    unfit = Parts([Part(), GpuPart(spec, None, Gate(unfit=True))])  # type: ignore[arg-type]
    unfit.before_attempt(0)
    with pytest.raises(UnavailableError, match="XID 79"):
        unfit.before_attempt(1)


def test_the_lease_s_fds_go_to_every_rank() -> None:
    spec, _ = make_job([sh("exit 0")])
    r, w = os.pipe()
    try:
        part = GpuPart(spec, Lease((), [r, w]), None)
        assert part.rank_setup(spec.ranks[0], 0).fds == (r, w)
        assert GpuPart(spec, None, None).rank_setup(spec.ranks[0], 0).fds == ()
    finally:
        os.close(r)
        os.close(w)


class Noted(Part):
    """Notes every hook as it is called; hands each rank `X=<attempt>` and a pipe's end."""

    def __init__(self, calls: list[str], fd: int = -1, refuse: int | None = None) -> None:
        self.calls, self.fd, self.refuse = calls, fd, refuse

    def attach(self, job: JobProgress, controls: Controls, loop: asyncio.AbstractEventLoop) -> None:
        self.calls.append(f"attach {job.phase.value}")

    def created(self) -> None:
        self.calls.append("created")

    def before_attempt(self, attempt: int) -> None:
        self.calls.append(f"before_attempt {attempt}")
        if attempt == self.refuse:
            raise UnavailableError("GPU 0 is not fit for the job: XID 79 reported")

    def rank_setup(self, rank: RankSpec, attempt: int) -> RankSetup:
        self.calls.append(f"rank_setup {rank.rank}")
        return RankSetup({"X": str(attempt)}, (self.fd,) if self.fd >= 0 else ())

    def changed(self, job: JobProgress, rank: RankProgress | None) -> None:
        if rank is not None and rank.exit is not None:
            self.calls.append(f"ended {rank.rank}")

    def complete(self, report: JobReport) -> JobReport:
        self.calls.append("complete")
        return report

    async def finished(self, job: JobProgress, report: JobReport) -> None:
        self.calls.append("finished")

    def close(self) -> None:
        self.calls.append("close")


def test_the_watcher_calls_the_parts_in_the_documented_order(
    wakeup: tuple[int, socket.socket], tmp_path: Path
) -> None:
    """And what `rank_setup` hands a rank reaches it: its environment, fds at 3, 4, ..."""
    calls: list[str] = []
    r, w = os.pipe()
    spec, units = make_job([sh('echo "attempt $X" >&3')])
    try:
        report = Watcher(
            spec,
            SystemdSupervisor(FakeSystemd(), units),
            wakeup[0],
            [Noted(calls, w), Noted([])],
            runtime_dir=tmp_path,
        ).run()
        os.close(w)
        w = -1
        assert os.read(r, 100) == b"attempt 0\n"
    finally:
        os.close(r)
        if w >= 0:
            os.close(w)
    assert report.status == 0
    assert calls == [
        "attach starting",
        "created",
        "before_attempt 0",
        "rank_setup 0",
        "ended 0",
        "complete",
        "finished",
        "close",
    ]


def test_a_part_that_refuses_a_restart_ends_the_job_as_a_failed_start(
    wakeup: tuple[int, socket.socket], tmp_path: Path
) -> None:
    """As the GPU gate does (--max-restarts): the restart's ranks never start, the parts
    still hear the end (the record has it), and the error is the job's."""
    calls: list[str] = []
    runs = tmp_path / "runs"
    spec, units = make_job([sh(f"echo run >> {runs}; exit 3")], max_restarts=2)
    sd = FakeSystemd()
    with pytest.raises(UnavailableError, match="XID 79"):
        Watcher(
            spec,
            SystemdSupervisor(sd, units),
            wakeup[0],
            [Noted(calls, refuse=1)],
            runtime_dir=tmp_path,
        ).run()
    assert runs.read_text() == "run\n"  # never restarted
    assert calls.count("rank_setup 0") == 1
    assert calls[-4:] == ["before_attempt 1", "complete", "finished", "close"]
    assert no_children_left()
