"""Across Slurm's requeues (gpulaunch/recovery/requeue.py, issue 38 item 2): the second level
of the budget (81, "requeue me"), the crash-loop rule over earlier runs, what a run carries
to the next in its record, and where the next run finds it. Under a real Slurm:
tests/integration/test_slurm_requeues.py."""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

import pytest

from gpulaunch.errors import UsageError
from gpulaunch.jobapi import filerecord, record
from gpulaunch.jobapi.earlier import earlier_run
from gpulaunch.jobapi.view import JobState
from gpulaunch.model import (
    CRASH_LOOP_STATUS,
    REQUEUE_STATUS,
    Carried,
    Cause,
    JobProgress,
    JobReport,
    Manager,
    Outcome,
    Phase,
    RankExit,
    RankResult,
)
from gpulaunch.recovery.classes import FailureClass
from gpulaunch.recovery.failure import Failure
from gpulaunch.recovery.options import add_recovery_options, recovery_options
from gpulaunch.recovery.policy import Verdict, decide
from gpulaunch.recovery.requeue import Requeues
from gpulaunch.recovery.settings import RecoveryOptions, RestartPolicy
from gpulaunch.recovery.tracker import Recovery
from gpulaunch.report import format_report, headline
from tests.unit.fakes import decode, job_view, record_view

EXIT1 = Failure(FailureClass.EXIT, 1, "rank 0 exit 1", runtime=2.0, rank=0)
LONG1 = Failure(FailureClass.EXIT, 1, "rank 0 exit 1", runtime=600.0, rank=0)
CONFIG = Failure(FailureClass.EXIT, 78, "rank 0 exit 78", runtime=1.0, rank=0)
OOM = Failure(FailureClass.OOM, 137, "rank 0 killed by the OOM killer", runtime=1.0, rank=0)
SLURM = {"SLURM_JOB_ID": "42", "SLURM_RESTART_COUNT": "1"}


def requeues(max_requeues: int | None, run: int, streak: int = 0, status: int = 1) -> Requeues:
    earlier = Carried("42", run - 1, 4, streak, "exit", status) if run else None
    return Requeues(max_requeues, "42", run, earlier)


@pytest.mark.parametrize(
    ("failures", "max_restarts", "requeue", "verdict"),
    [
        ([EXIT1], 0, requeues(2, 0), Verdict.REQUEUE),  # no restarts here: requeue at once
        ([EXIT1, EXIT1], 1, requeues(2, 1), Verdict.REQUEUE),  # restarts spent, requeues left
        ([EXIT1], 1, requeues(2, 1), Verdict.RESTART),  # restarts first
        ([EXIT1], 0, requeues(2, 2), Verdict.SPENT),  # requeues spent: the rank's own status
        ([EXIT1], 0, requeues(None, 0), Verdict.SPENT),  # no --max-requeues
        ([EXIT1], 0, Requeues(2), Verdict.SPENT),  # not in Slurm
        ([CONFIG], 0, requeues(2, 0), Verdict.NO_RESTART_CODE),  # 78 is never retried
        ([OOM], 0, requeues(2, 0), Verdict.NOT_RESTARTED),  # not in --restart-on
        ([EXIT1], 0, requeues(5, 1, streak=2), Verdict.CRASH_LOOP),  # 2 earlier + 1
        ([EXIT1], 5, requeues(5, 1, streak=2), Verdict.CRASH_LOOP),  # also with restarts left
        ([EXIT1], 0, requeues(5, 1, streak=2, status=2), Verdict.REQUEUE),  # not alike
        ([LONG1], 0, requeues(5, 1, streak=2), Verdict.REQUEUE),  # this one made progress
        ([EXIT1], 0, requeues(5, 1, streak=1), Verdict.REQUEUE),  # 2 in a row only
    ],
)
def test_decide_with_requeues(
    failures: list[Failure], max_restarts: int, requeue: Requeues, verdict: Verdict
) -> None:
    assert decide(RestartPolicy(), max_restarts, failures, requeue=requeue).verdict is verdict


def test_the_lines_say_which_requeue_and_which_runs() -> None:
    line = decide(RestartPolicy(), 1, [EXIT1, EXIT1], requeue=requeues(3, 1)).line
    assert line == (
        "gpulaunch: rank 0 exit 1; not restarting here (--max-restarts 1 spent): exit 81 for "
        "Slurm to requeue the job (requeue 2 of 3, --max-requeues)"
    )
    line = decide(RestartPolicy(), 0, [EXIT1], requeue=requeues(5, 1, streak=2)).line
    assert line is not None and "3 attempts in a row failed this way (2 of them in earlier " in line
    # an interrupt while the gang stopped: no requeue either
    assert (
        decide(RestartPolicy(), 0, [EXIT1], stopping=True, requeue=requeues(2, 0)).verdict
        is Verdict.STOPPING
    )


def test_only_this_jobs_earlier_runs_carry_over() -> None:
    mine = Requeues(3, "42", 2)
    assert mine.with_earlier(Carried("42", 1, 5)).first_attempt == 5
    assert mine.with_earlier(Carried("43", 1, 5)).earlier is None  # another Slurm job's
    assert mine.with_earlier(Carried("42", 2, 5)).earlier is None  # not an earlier run's
    assert mine.with_earlier(None).first_attempt == 0
    assert Requeues.of_environment(3, {}).slurm_job is None
    assert Requeues.of_environment(3, SLURM) == Requeues(3, "42", 1)
    assert Requeues.of_environment(3, {"SLURM_JOB_ID": "42"}).run == 0  # the first run


def _exit(code: int) -> RankExit:
    return RankExit(code=code, signal=None, stopped_by_watcher=False, observed_at=1.0, runtime=1.0)


def _report(status: int, cause: Cause, attempt: int = 0, code: int | None = None) -> JobReport:
    rank = RankResult(rank=0, unit="u", pid=5, exit=_exit(status if code is None else code))
    return JobReport("j", status, cause, 0, None, ranks=(rank,), restarts=attempt)


def test_the_tracker_ends_a_run_with_81_and_carries_its_streak() -> None:
    policy = RestartPolicy(crash_loop=4)
    rec = Recovery(1, RecoveryOptions(restart=policy, requeue=requeues(3, 1, streak=1)))
    failed, exits = Outcome(1, Cause.RANK_FAILED, 0), {0: _exit(1)}
    assert rec.after(failed, exits, stopping=False).verdict is Verdict.RESTART  # type: ignore[union-attr]
    assert rec.after(failed, exits, stopping=False).verdict is Verdict.REQUEUE  # type: ignore[union-attr]
    assert rec.outcome(failed) == Outcome(REQUEUE_STATUS, Cause.REQUEUE, 0)
    report = rec.complete(_report(1, Cause.RANK_FAILED, attempt=5), 5)
    # 4 attempts before this run, 2 in it; 1 failure before it and 2 in it, in a row
    assert report.carried == Carried("42", 1, 6, 3, "exit", 1)
    # while it runs (its live records): the attempts only
    assert rec.carried(5, ended=False) == Carried("42", 1, 6)
    # a run whose last attempt did not fail carries no streak
    rec = Recovery(0, RecoveryOptions(requeue=requeues(3, 1, streak=2)))
    rec.after(Outcome(0, Cause.SUCCEEDED, None), {0: _exit(0)}, stopping=False)
    assert rec.complete(_report(0, Cause.SUCCEEDED), 4).carried == Carried("42", 1, 5)
    # outside Slurm: nothing
    assert Recovery(0).complete(_report(0, Cause.SUCCEEDED), 0).carried is None


def test_a_crash_loop_across_runs_is_80() -> None:
    rec = Recovery(3, RecoveryOptions(requeue=requeues(9, 2, streak=2)))
    failed = Outcome(1, Cause.RANK_FAILED, 0)
    decision = rec.after(failed, {0: _exit(1)}, stopping=False)
    assert decision is not None and decision.verdict is Verdict.CRASH_LOOP
    assert rec.outcome(failed) == Outcome(CRASH_LOOP_STATUS, Cause.CRASH_LOOP, 0)


def test_the_report_says_requeue_it() -> None:
    carried = Carried("42", 1, 3, 1, "exit", 1)
    report = dataclasses.replace(
        _report(REQUEUE_STATUS, Cause.REQUEUE, attempt=2, code=1), carried=carried
    )
    assert headline(report) == (
        "gpulaunch: job j failed: rank 0 exit 1; restarts spent here (status 81: requeue it)"
    )
    text = format_report(report)
    assert "run 2 of Slurm job 42 (requeued 1 time): 3 attempts over its runs" in text, text
    assert "were restarted" not in text  # the attempts of earlier runs were no restarts here
    hung = JobReport("j", REQUEUE_STATUS, Cause.REQUEUE, None, None)
    assert headline(hung).startswith("gpulaunch: job j failed: hung; restarts spent here")
    assert JobState.of_report(report) is JobState.FAILED


def parse(*argv: str) -> RecoveryOptions:
    p = argparse.ArgumentParser(exit_on_error=False)
    add_recovery_options(p)
    return recovery_options(p.parse_args(list(argv)))


def test_max_requeues_outside_slurm_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    with pytest.raises(UsageError) as err:
        parse("--max-requeues", "3")
    assert err.value.exit_code == 2 and "not in a Slurm job" in err.value.message
    assert parse().requeue.max_requeues is None  # without it: nothing asked
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "2")
    assert parse("--max-requeues", "3").requeue == Requeues(3, "42", 2)
    for bad in ("-1", "x", "1000001"):
        with pytest.raises(argparse.ArgumentError):
            parse("--max-requeues", bad)


def test_max_requeues_with_several_nodes_is_refused(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from gpulaunch.cli import main

    monkeypatch.setenv("SLURM_JOB_ID", "42")
    script = tmp_path / "train.py"
    script.write_text("")
    argv = ["render", "--nnodes", "2", "--node-rank", "0", "--max-requeues", "2", str(script)]
    with pytest.raises(SystemExit) as ended:
        main(argv)
    assert ended.value.code == 2
    assert "--max-requeues is for a job on one node" in capsys.readouterr().err


def test_the_record_keeps_the_carried_state() -> None:
    carried = Carried("42", 1, 3, 2, "exit", 1)
    view = dataclasses.replace(job_view(), carried=carried)
    entry = decode(record.encode(record.fields(view, "job j failed")))
    assert json.loads(entry["GPULAUNCH_SLURM_RUNS"])["attempts"] == 3
    entry.update({"_UID": "0", "__REALTIME_TIMESTAMP": "1700000000000000"})
    assert record.parse(entry).carried == carried
    assert view.to_json()["slurm_runs"]["streak"] == 2
    assert view.report().carried == carried  # `gpulaunch status` of the record says the run
    entry["GPULAUNCH_SLURM_RUNS"] = '{"run": -1}'
    with pytest.raises(ValueError):
        record.parse(entry)


def test_the_live_record_carries_the_attempts() -> None:
    """A run whose watcher is SIGKILLed writes no end record: its start record has them."""
    from gpulaunch.jobapi.view import JobView
    from tests.unit.fakes import make_job

    spec, _ = make_job([["true"]])
    progress = JobProgress(spec, Phase.RUNNING, (), 3, 1, carried=Carried("42", 1, 4))
    assert JobView.of_progress(progress).carried == Carried("42", 1, 4)


def test_the_next_run_finds_the_last_runs_record(tmp_path: Path) -> None:
    base = tmp_path / "state" / "gpulaunch" / "jobs"
    env = {"SLURM_JOB_ID": "42", "SLURM_RESTART_COUNT": "2"}
    assert earlier_run("j", Manager.USER, env, base) is None  # no record
    ended = record_view(JobState.FAILED)
    filerecord.write(dataclasses.replace(ended, carried=Carried("41", 1, 9)), "x", base)
    filerecord.write(dataclasses.replace(ended, job="k", carried=Carried("42", 1, 7)), "x", base)
    assert earlier_run("j", Manager.USER, env, base) is None  # another Slurm job's; another id
    mine = Carried("42", 1, 4, 1, "exit", 1)
    filerecord.write(dataclasses.replace(ended, carried=mine), "failed", base)
    assert earlier_run("j", Manager.USER, env, base) == mine
    assert earlier_run("j", Manager.USER, {**env, "SLURM_RESTART_COUNT": "1"}, base) is None
    assert earlier_run("j", Manager.USER, {"SLURM_JOB_ID": "42"}, base) is None  # a first run
