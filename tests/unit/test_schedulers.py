"""What schedulers read from a job: Kubernetes' termination message, DCGM's job map."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpulaunch.base.protocol import Layout, NodeFailure, NodeInfo
from gpulaunch.model import (
    CRASH_LOOP_STATUS,
    PREEMPTED_STATUS,
    Cause,
    JobReport,
    RankExit,
    RankResult,
)
from gpulaunch.schedulers.jobmap import add_job, jobs_on, remove_job
from gpulaunch.schedulers.slurm import SlurmEnd, _seconds, classify
from gpulaunch.schedulers.termination import (
    LIMIT,
    termination_message,
    termination_path,
    write_message,
)


def _exit(code: int | None = None, sig: int | None = None, stopped: bool = False) -> RankExit:
    return RankExit(code=code, signal=sig, stopped_by_watcher=stopped, observed_at=1, runtime=2)


def _report(
    cause: Cause, status: int, error: str | None = None, cause_rank: int | None = 1, **kw: object
) -> JobReport:
    ranks = (
        RankResult(0, "u0", 10, _exit(sig=15, stopped=True)),
        RankResult(1, "u1", 11, _exit(3), error=error, error_source="its stderr"),
    )
    return JobReport("train", status, cause, cause_rank, None, ranks, **kw)  # type: ignore[arg-type]


def test_a_rank_failure_names_rank_status_attempt_and_the_errors_end() -> None:
    trace = "Traceback (most recent call last):\n" + "  frame\n" * 500 + "ValueError: boom"
    text = termination_message(_report(Cause.RANK_FAILED, 3, error=trace, restarts=2))
    assert len(text.encode()) <= LIMIT
    lines = text.splitlines()
    assert lines[0] == "job train failed: rank 1 exit 3 (status 3)"
    assert lines[1] == "cause: rank-failed; status 3; rank 1; attempt 3 (2 restarted)"
    assert lines[2] == "rank 1's error (its stderr):"
    assert lines[-1] == "  ValueError: boom"  # the exception, at the end, is kept


def test_every_way_a_job_ends_has_its_headline() -> None:
    cases = {
        Cause.SUCCEEDED: (0, "job train succeeded"),
        Cause.PREEMPTED: (PREEMPTED_STATUS, "job train preempted (status 79: requeue it)"),
        Cause.CRASH_LOOP: (CRASH_LOOP_STATUS, "job train failed in a crash loop"),
    }
    for cause, (status, head) in cases.items():
        report = _report(cause, status, cause_rank=None if cause is not Cause.CRASH_LOOP else 1)
        if cause is Cause.SUCCEEDED:
            report = JobReport("train", 0, cause, None, None, (RankResult(0, "u", 1, _exit(0)),))
        text = termination_message(report)
        assert text.startswith(head), text
        assert f"status {status}" in text.splitlines()[1]


def test_another_nodes_failure_names_that_node_and_its_error() -> None:
    nodes = (NodeInfo(0, "h0", 0, 2, 100), NodeInfo(1, "h1", 2, 2, 200))
    layout = Layout(1, 2, 4, "h0", 1, True, "r", "h0:1", nodes)
    failure = NodeFailure(0, "h0", 7, "rank 1 exit 7", 1, "RuntimeError: x", "its error file")
    report = JobReport(
        "train", 7, Cause.NODE_FAILED, None, None, (), layout=layout, node_failure=failure
    )
    lines = termination_message(report).splitlines()
    assert lines[1] == "cause: node-failed; status 7; rank 1; node 0 (h0); attempt 1"
    assert lines[-2:] == ["rank 1's error (its error file):", "  RuntimeError: x"]


def test_a_huge_job_id_still_fits() -> None:
    report = JobReport("j" * 9000, 0, Cause.SUCCEEDED, None, None, ())
    assert len(termination_message(report).encode()) <= LIMIT


def test_where_it_goes(tmp_path: Path) -> None:
    assert termination_path(tmp_path / "x", {}) == tmp_path / "x"
    assert termination_path(None, {"GPULAUNCH_TERMINATION_LOG": "/a"}) == Path("/a")
    expected = Path("/dev/termination-log") if Path("/dev/termination-log").is_file() else None
    assert termination_path(None, {}) == expected


def test_written_whole_and_replaced(tmp_path: Path) -> None:
    path = tmp_path / "termination-log"
    path.write_text("x" * 10000)
    assert write_message(path, termination_message(_report(Cause.RANK_FAILED, 3))) is None
    assert path.read_text().startswith("job train failed")
    assert len(path.read_bytes()) <= LIMIT
    why = write_message(tmp_path / "no" / "such", "x")
    assert why is not None and "cannot write the termination message" in why


def test_the_job_map_keeps_every_jobs_line(tmp_path: Path) -> None:
    add_job(tmp_path, "a", [0, 1])
    add_job(tmp_path, "b", [1, 2])
    add_job(tmp_path, "a", [0])  # again: once
    assert jobs_on(tmp_path) == {0: ["a"], 1: ["a", "b"], 2: ["b"]}
    remove_job(tmp_path, "a", [0, 1])
    assert jobs_on(tmp_path) == {1: ["b"], 2: ["b"]}
    assert not (tmp_path / "0").exists()  # a GPU's file goes with its last job
    remove_job(tmp_path, "b", [1, 2])
    remove_job(tmp_path, "b", [1, 2])  # twice (the watcher, then the anchor): harmless
    assert sorted(p.name for p in tmp_path.iterdir()) == [".gpulaunch.lock"]


def test_concurrent_writers_lose_no_line(tmp_path: Path) -> None:
    pids = []
    for n in range(8):
        pid = os.fork()
        if pid == 0:
            try:
                for i in range(20):
                    add_job(tmp_path, f"j{n}-{i}", [0])
            finally:
                os._exit(0)
        pids.append(pid)
    for pid in pids:
        assert os.waitpid(pid, 0)[1] == 0
    assert sorted(jobs_on(tmp_path)[0]) == sorted(f"j{n}-{i}" for n in range(8) for i in range(20))


# `scontrol show job -o` as Slurm 22.05 answered it when each of these SIGTERMs came (the
# box's Slurm, seen by a probe script that trapped SIGTERM), cut to the fields that matter.
REQUEUE = (
    "JobId=2 JobName=job.sh JobState=COMPLETING Reason=None Dependency=(null) Requeue=1 "
    "Restarts=1 BatchFlag=1 ExitCode=0:0 RunTime=00:00:00 TimeLimit=UNLIMITED EndTime=Unknown"
)
SCANCEL = (
    "JobId=1 JobName=job.sh JobState=COMPLETING Reason=None Dependency=(null) Requeue=1 "
    "Restarts=0 BatchFlag=1 ExitCode=0:0 RunTime=00:00:00 TimeLimit=UNLIMITED "
    "EndTime=2026-12-02T05:56:15"
)
TIMELIMIT = (
    "JobId=3 JobName=job.sh JobState=COMPLETING Reason=TimeLimit Dependency=(null) Requeue=1 "
    "Restarts=0 BatchFlag=1 ExitCode=0:0 RunTime=00:01:16 TimeLimit=00:01:00"
)
SLURM = {"SLURM_JOB_ID": "3"}


@pytest.mark.parametrize(
    ("answer", "env", "end"),
    [
        (REQUEUE, SLURM, SlurmEnd.REQUEUED),
        (REQUEUE, {**SLURM, "SLURM_RESTART_COUNT": "1"}, SlurmEnd.CANCELLED),  # its own run's
        (SCANCEL, SLURM, SlurmEnd.CANCELLED),
        (TIMELIMIT, SLURM, SlurmEnd.TIME_LIMIT),
        (TIMELIMIT.replace("Reason=TimeLimit", "Reason=None"), SLURM, SlurmEnd.TIME_LIMIT),
        (SCANCEL.replace("COMPLETING", "PREEMPTED"), SLURM, SlurmEnd.REQUEUED),
        (None, SLURM, None),  # no answer, no end time: not known
        (None, {**SLURM, "SLURM_JOB_END_TIME": "1000"}, SlurmEnd.TIME_LIMIT),
        (None, {**SLURM, "SLURM_JOB_END_TIME": "9000"}, None),
        (SCANCEL, {}, None),  # not in Slurm
        (SCANCEL.replace("COMPLETING", "RUNNING"), SLURM, None),  # a notice: the job goes on
    ],
)
def test_why_slurm_sent_sigterm(
    answer: str | None, env: dict[str, str], end: SlurmEnd | None
) -> None:
    assert classify(answer, env, now=1000.0) is end


def test_slurm_time_spans() -> None:
    assert _seconds("00:01:00") == 60
    assert _seconds("1-02:00:00") == 93600
    assert _seconds("05:30") == 330
    assert _seconds("UNLIMITED") is None
