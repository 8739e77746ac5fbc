"""Restarts by failure class, crash loops and preemption: the pure decisions (gpulaunch/recovery/).

The watcher acting on them, with real children: tests/unit/test_watcher_recovery.py; with a
real systemd and Slurm: tests/integration/test_recovery.py.
"""

from __future__ import annotations

import argparse
import dataclasses
import signal
import time
from pathlib import Path

import pytest

from gpulaunch.errors import UsageError
from gpulaunch.model import (
    CRASH_LOOP_STATUS,
    PREEMPTED_STATUS,
    Cause,
    OomKill,
    Outcome,
    RankExit,
)
from gpulaunch.recovery.classes import FailureClass, parse_classes
from gpulaunch.recovery.failure import Failure, classify, status_class
from gpulaunch.recovery.options import add_recovery_options, parse_signal, recovery_options
from gpulaunch.recovery.policy import Verdict, crash_loop_length, decide
from gpulaunch.recovery.preempt import (
    DEADLINE_FILE_ENV,
    GRACE_ENV,
    SIGNAL_ENV,
    PreemptPolicy,
    write_deadline,
)
from gpulaunch.recovery.progress import made_progress
from gpulaunch.recovery.settings import DEFAULT_RESTART_ON, RecoveryOptions, RestartPolicy
from gpulaunch.recovery.tracker import Recovery

EXIT1 = Failure(FailureClass.EXIT, 1, "rank 0 exit 1", runtime=2.0, rank=0)
EXIT2 = Failure(FailureClass.EXIT, 2, "rank 0 exit 2", runtime=2.0, rank=0)
LONG1 = Failure(FailureClass.EXIT, 1, "rank 0 exit 1", runtime=600.0, rank=0)
CONFIG = Failure(FailureClass.EXIT, 78, "rank 1 exit 78", runtime=1.0, rank=1)
OOM = Failure(FailureClass.OOM, 137, "rank 0 killed by the OOM killer", runtime=1.0, rank=0)
HANG = Failure(FailureClass.HANG, 124, "the job hung (--hang-timeout)", runtime=30.0)


def rank_exit(code: int | None = None, sig: int | None = None, oom: bool = False) -> RankExit:
    return RankExit(
        code=code,
        signal=sig,
        stopped_by_watcher=False,
        observed_at=1.0,
        runtime=3.0,
        oom=OomKill(memory=None, limit=None, source="memory.events") if oom else None,
    )


@pytest.mark.parametrize(
    ("outcome", "exit", "kind"),
    [
        (Outcome(3, Cause.RANK_FAILED, 0), rank_exit(code=3), FailureClass.EXIT),
        (Outcome(139, Cause.RANK_FAILED, 0), rank_exit(sig=signal.SIGSEGV), FailureClass.SIGNAL),
        (Outcome(137, Cause.RANK_FAILED, 0), rank_exit(sig=9, oom=True), FailureClass.OOM),
        (Outcome(124, Cause.HUNG, None), rank_exit(sig=15), FailureClass.HANG),
        (Outcome(75, Cause.NODE_FAILED, None), rank_exit(sig=15), FailureClass.NODE),
        (Outcome(0, Cause.SUCCEEDED, None), rank_exit(code=0), None),
        (Outcome(143, Cause.INTERRUPTED, None), rank_exit(sig=15), None),
        (Outcome(79, Cause.PREEMPTED, None), rank_exit(sig=15), None),
    ],
)
def test_classify(outcome: Outcome, exit: RankExit, kind: FailureClass | None) -> None:
    failure = classify(outcome, {0: exit})
    assert (failure.kind if failure else None) == kind
    if failure is not None:
        assert failure.status == outcome.status


def test_another_nodes_rank_is_classified_by_its_status() -> None:
    """Through the store only the status comes: 128+N a signal, else an exit code."""
    assert status_class(1) is FailureClass.EXIT and status_class(128) is FailureClass.EXIT
    assert status_class(128 + signal.SIGKILL) is FailureClass.SIGNAL


def test_the_policy_by_class_is_the_same_on_every_node() -> None:
    policy = RestartPolicy()
    assert policy.allows(FailureClass.EXIT, 1)
    assert not policy.allows(FailureClass.EXIT, 78)  # --no-restart-exit-code
    assert policy.allows(FailureClass.SIGNAL, 78)  # 78 is no exit code then
    assert not policy.allows(FailureClass.OOM, 137)  # not in --restart-on


def test_failure_classes_are_named_only_in_recovery() -> None:
    """A new failure class touches recovery/ (and docs) only: no other module of the
    launcher names a class (multinode/rounds.py once classified a rank's status itself)."""
    package = Path(__file__).resolve().parents[2] / "gpulaunch"
    outside = [
        str(p.relative_to(package))
        for p in package.rglob("*.py")
        if (package / "recovery") not in p.parents and "FailureClass." in p.read_text()
    ]
    assert outside == []


def test_made_progress_is_running_long_enough() -> None:
    assert not made_progress(EXIT1, 60.0)
    assert made_progress(LONG1, 60.0)


def test_a_step_is_progress_and_no_crash_loop() -> None:
    """An attempt in which a rank reported a training step (the progress channel) made
    progress however soon it failed: three such attempts are no crash loop."""
    assert made_progress(dataclasses.replace(EXIT1, stepped=True), 60.0)
    rec = Recovery(5, RecoveryOptions(restart=RestartPolicy(crash_loop=2)))
    exits, failed = {0: rank_exit(code=1)}, Outcome(1, Cause.RANK_FAILED, 0)
    for _ in range(3):
        rec.stepped = True  # as the watcher sets it from its ranks at the attempt's end
        decision = rec.after(failed, exits, stopping=False)
        assert decision is not None and decision.restart
    rec.stepped = False
    rec.after(failed, exits, stopping=False)
    decision = rec.after(failed, exits, stopping=False)
    assert decision is not None and decision.verdict is Verdict.CRASH_LOOP


@pytest.mark.parametrize(
    ("failures", "max_restarts", "verdict"),
    [
        ([EXIT1], 0, Verdict.SPENT),  # --max-restarts 0: as ever, nothing restarts
        ([EXIT1], 3, Verdict.RESTART),
        ([EXIT1, EXIT1], 3, Verdict.RESTART),
        ([EXIT1, EXIT1, EXIT1], 5, Verdict.CRASH_LOOP),  # K=3 in a row, the same way
        ([EXIT1, EXIT1, EXIT1], 2, Verdict.SPENT),  # no restart left: nothing cut short
        ([EXIT1, EXIT2, EXIT1], 5, Verdict.RESTART),  # not the same way
        ([EXIT1, LONG1, EXIT1], 5, Verdict.RESTART),  # one of them made progress
        ([LONG1, LONG1, LONG1], 5, Verdict.RESTART),  # each made progress: no loop
        ([LONG1, EXIT1, EXIT1, EXIT1], 5, Verdict.CRASH_LOOP),  # in a row after it
        ([CONFIG], 5, Verdict.NO_RESTART_CODE),  # 78 (EX_CONFIG) ends at once
        ([OOM], 5, Verdict.NOT_RESTARTED),  # OOM kills are not restarted by default
        ([HANG], 5, Verdict.RESTART),
    ],
)
def test_decide_by_default(failures: list[Failure], max_restarts: int, verdict: Verdict) -> None:
    decision = decide(RestartPolicy(), max_restarts, failures)
    assert decision.verdict is verdict
    assert decision.restart == (verdict is Verdict.RESTART)
    # every early end says why, in one line; spent restarts leave it to the report
    assert (decision.line is not None) == (verdict not in (Verdict.SPENT, Verdict.STOPPING))


def test_decide_lines_say_why() -> None:
    policy = RestartPolicy()
    assert decide(policy, 3, [EXIT1]).line == (
        "gpulaunch: rank 0 exit 1; restarting all ranks (restart 1 of 3)"
    )
    line = decide(policy, 5, [EXIT1, EXIT1, EXIT1]).line or ""
    assert "a crash loop: 3 attempts in a row" in line and "--crash-loop 3" in line
    assert "exit 78 says do not restart" in (decide(policy, 5, [CONFIG]).line or "")
    assert "oom is not in --restart-on (exit,hang,node,signal)" in (
        decide(policy, 5, [OOM]).line or ""
    )


def test_decide_with_other_policies() -> None:
    everything = RestartPolicy(restart_on=frozenset(FailureClass), crash_loop=0)
    assert decide(everything, 5, [OOM]).restart
    assert decide(everything, 5, [EXIT1] * 5).restart  # --crash-loop 0: never a loop
    codes = RestartPolicy(no_restart_codes=frozenset({78, 2}))
    assert decide(codes, 5, [EXIT2]).verdict is Verdict.NO_RESTART_CODE
    two = RestartPolicy(crash_loop=2, progress_after=1.0)
    assert decide(two, 5, [EXIT1, EXIT1]).restart  # each ran 2 s: progress
    assert decide(RestartPolicy(crash_loop=2), 5, [EXIT1, EXIT1]).verdict is Verdict.CRASH_LOOP
    assert decide(RestartPolicy(), 5, [EXIT1], stopping=True).verdict is Verdict.STOPPING
    assert crash_loop_length(RestartPolicy(), []) == 0


def test_tracker_outcomes() -> None:
    rec = Recovery(5, RecoveryOptions(restart=RestartPolicy(crash_loop=2)))
    exits = {0: rank_exit(code=1)}
    failed = Outcome(1, Cause.RANK_FAILED, 0)
    said: list[str] = []
    assert rec.after(failed, exits, stopping=False) is not None
    decision = rec.after(failed, exits, stopping=False)
    assert decision is not None and decision.verdict is Verdict.CRASH_LOOP
    assert rec.outcome(failed) == Outcome(CRASH_LOOP_STATUS, Cause.CRASH_LOOP, 0)
    assert rec.line == decision.line
    # preempted: the interrupt it made is the preemption; a rank failure before it stays
    rec = Recovery(5, RecoveryOptions(preempt=PreemptPolicy(grace=30)))
    assert not rec.preempted(signal.SIGUSR1, 1.0) and rec.preempted(signal.SIGTERM, 1.0)
    assert not rec.preempted(signal.SIGTERM, 2.0)  # only the first
    interrupted = Outcome(143, Cause.INTERRUPTED, None)
    assert rec.outcome(interrupted) == Outcome(PREEMPTED_STATUS, Cause.PREEMPTED, None)
    assert rec.outcome(failed) == failed
    assert rec.after(interrupted, {}, stopping=True) is None  # no failure: no restart
    assert rec.line is None and said == []


def test_preempt_policy(tmp_path: Path) -> None:
    off = PreemptPolicy()
    assert not off.is_notice(signal.SIGTERM) and off.rank_environment(tmp_path) == {}
    on = PreemptPolicy(grace=20, signal=signal.SIGUSR1)
    assert on.is_notice(signal.SIGTERM) and not on.is_notice(signal.SIGUSR1)
    assert on.rank_environment() == {GRACE_ENV: "20", SIGNAL_ENV: "SIGUSR1"}
    assert on.rank_environment(tmp_path)[DEADLINE_FILE_ENV] == str(tmp_path / "preempt-deadline")


def test_the_deadline_is_written_at_the_notice(tmp_path: Path) -> None:
    rec = Recovery(0, RecoveryOptions(preempt=PreemptPolicy(grace=30)))
    path = Path(rec.rank_environment(tmp_path)[DEADLINE_FILE_ENV])
    assert not path.exists()  # nothing before the notice
    before = time.time()
    assert rec.preempted(signal.SIGTERM, 1.0)
    assert (
        before + 30 - 0.001 <= float(path.read_text()) <= time.time() + 30 + 0.001
    )  # (rounded to ms)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["preempt-deadline"]


def test_write_deadline_never_through_a_link(tmp_path: Path) -> None:
    (tmp_path / "elsewhere").write_text("x")
    (tmp_path / "d.new").symlink_to(tmp_path / "elsewhere")
    assert not write_deadline(tmp_path / "d", 5.0)
    assert (tmp_path / "elsewhere").read_text() == "x"
    assert write_deadline(tmp_path / "e", 5.0) and (tmp_path / "e").read_text() == "5.000\n"


def parse(*argv: str) -> RecoveryOptions:
    p = argparse.ArgumentParser(exit_on_error=False)
    add_recovery_options(p)
    return recovery_options(p.parse_args(list(argv)))


def test_options_defaults() -> None:
    opts = parse()
    assert opts.restart.restart_on == DEFAULT_RESTART_ON
    assert FailureClass.OOM not in DEFAULT_RESTART_ON
    assert opts.restart.no_restart_codes == {78}
    assert (opts.restart.crash_loop, opts.restart.progress_after) == (3, 60.0)
    assert opts.preempt == PreemptPolicy()


def test_options_given() -> None:
    opts = parse(
        "--restart-on", "exit,oom", "--no-restart-exit-code", "3,4", "--no-restart-exit-code",
        "9", "--crash-loop", "0", "--progress-after", "5", "--preempt-grace", "30",
        "--preempt-signal", "usr1", "--preempt-on", "TERM,SIGUSR2",
    )  # fmt: skip
    assert opts.restart == RestartPolicy(
        restart_on=frozenset({FailureClass.EXIT, FailureClass.OOM}),
        no_restart_codes=frozenset({3, 4, 9, 78}),
        crash_loop=0,
        progress_after=5.0,
    )
    assert opts.preempt == PreemptPolicy(
        grace=30.0, signal=signal.SIGUSR1, notices=frozenset({signal.SIGTERM, signal.SIGUSR2})
    )
    assert parse("--restart-on", "all").restart.restart_on == frozenset(FailureClass)
    assert parse("--restart-on", "none").restart.restart_on == frozenset()


@pytest.mark.parametrize(
    "argv",
    [
        ["--restart-on", "exit,segfault"],
        ["--restart-on", ","],
        ["--no-restart-exit-code", "0"],
        ["--no-restart-exit-code", "256"],
        ["--no-restart-exit-code", "x"],
        ["--crash-loop", "1"],
        ["--crash-loop", "-1"],
        ["--progress-after", "0"],
        ["--progress-after", "nan"],
        ["--preempt-grace", "inf"],
        ["--preempt-grace", "-5"],
        ["--preempt-grace", "10", "--preempt-signal", "NOPE"],
        ["--preempt-grace", "10", "--preempt-on", "QUIT"],  # the watcher does not hear it
    ],
)
def test_options_refused(argv: list[str]) -> None:
    with pytest.raises(argparse.ArgumentError):
        parse(*argv)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--preempt-signal", "USR1"], "--preempt-signal needs --preempt-grace"),
        (["--preempt-on", "USR1"], "--preempt-on needs --preempt-grace"),
        (["--preempt-grace", "9", "--preempt-signal", "KILL"], "cannot be caught"),
        (["--preempt-grace", "9", "--preempt-signal", "19"], "cannot be caught"),
    ],
)
def test_options_refused_together(argv: list[str], message: str) -> None:
    with pytest.raises(UsageError, match=message):
        parse(*argv)


def test_parse_signal_and_classes() -> None:
    assert parse_signal("TERM") == parse_signal("sigterm") == parse_signal("15") == 15
    with pytest.raises(ValueError, match="no signal has the number 0"):
        parse_signal("0")
    assert parse_classes("Exit, signal") == {FailureClass.EXIT, FailureClass.SIGNAL}
    with pytest.raises(ValueError, match="unknown failure class 'x'"):
        parse_classes("exit,x")


def test_a_preempted_job_is_stopped_not_failed() -> None:
    """`list`, `status` and the bus call a preempted job stopped; a crash loop failed."""
    from gpulaunch.jobapi.view import JobState

    assert JobState.of_cause(Cause.PREEMPTED, PREEMPTED_STATUS) is JobState.STOPPED
    assert JobState.of_cause(Cause.CRASH_LOOP, CRASH_LOOP_STATUS) is JobState.FAILED
