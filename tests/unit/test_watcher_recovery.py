"""The watcher acting on recovery/'s decisions, with fakes.py's fake systemd and real
children: a crash loop ends after K attempts, exit 78 at once, an OOM-like class not
restarted, a preemption gives the ranks --preempt-grace, not --grace."""

from __future__ import annotations

import signal
import socket
import threading
import time
from pathlib import Path

from gpulaunch.model import CRASH_LOOP_STATUS, PREEMPTED_STATUS, Cause, JobReport
from gpulaunch.recovery.classes import FailureClass
from gpulaunch.recovery.preempt import PreemptPolicy
from gpulaunch.recovery.settings import RecoveryOptions, RestartPolicy
from gpulaunch.report import format_report
from gpulaunch.supervisor.systemd import SystemdSupervisor
from gpulaunch.watcher.loop import Watcher
from tests.unit.fakes import FakeSystemd, make_job, no_children_left, sh


def run(
    commands: list[list[str]],
    wakeup: tuple[int, socket.socket],
    tmp_path: Path,
    max_restarts: int,
    recovery: RecoveryOptions,
) -> tuple[JobReport, list[str]]:
    spec, units = make_job(commands, max_restarts=max_restarts)
    watcher = Watcher(
        spec,
        SystemdSupervisor(FakeSystemd(), units),
        wakeup[0],
        runtime_dir=tmp_path,
        recovery=recovery,
    )
    said: list[str] = []
    message = watcher.output.message
    watcher.output.message = lambda text: (said.append(text), message(text))[1]  # type: ignore[method-assign]
    return watcher.run(), said


def test_crash_loop_ends_after_k_attempts(
    wakeup: tuple[int, socket.socket], tmp_path: Path
) -> None:
    """--max-restarts 10, a rank that fails at once each time: 3 attempts, then status 80."""
    attempts = tmp_path / "attempts"
    script = sh(f'echo "$TORCHELASTIC_RESTART_COUNT" >> {attempts}; exit 3')
    report, said = run([script, sh("exec sleep 60")], wakeup, tmp_path, 10, RecoveryOptions())
    assert attempts.read_text().split() == ["0", "1", "2"]
    assert (report.status, report.cause, report.cause_rank) == (
        CRASH_LOOP_STATUS,
        Cause.CRASH_LOOP,
        0,
    )
    assert report.restarts == 2
    assert report.recovery is not None and "a crash loop: 3 attempts in a row" in report.recovery
    assert said.count(report.recovery) == 0  # the report's line, said once (issue 35)
    text = format_report(report)
    assert "failed in a crash loop (--crash-loop): rank 0 exit 3 (status 80)" in text
    assert report.recovery in text
    assert no_children_left()


def test_progress_is_no_crash_loop(wakeup: tuple[int, socket.socket], tmp_path: Path) -> None:
    """Attempts that ran --progress-after each are restarted while --max-restarts allows."""
    opts = RecoveryOptions(restart=RestartPolicy(progress_after=0.2))
    report, _ = run([sh("sleep 0.3; exit 3")], wakeup, tmp_path, 3, opts)
    assert (report.status, report.cause, report.restarts, report.recovery) == (
        3,
        Cause.RANK_FAILED,
        3,
        None,
    )


def test_no_restart_exit_code_ends_at_once(
    wakeup: tuple[int, socket.socket], tmp_path: Path
) -> None:
    report, said = run([sh("exit 78")], wakeup, tmp_path, 5, RecoveryOptions())
    assert (report.status, report.cause, report.restarts) == (78, Cause.RANK_FAILED, 0)
    assert report.recovery == ("gpulaunch: rank 0 exit 78; not restarting: exit 78 says do not "
                               "restart (--no-restart-exit-code)")  # fmt: skip
    assert said == []  # the report says it, once (issue 35)


def test_class_not_restarted(wakeup: tuple[int, socket.socket], tmp_path: Path) -> None:
    """--restart-on exit: a rank killed by a signal ends the job at once."""
    opts = RecoveryOptions(restart=RestartPolicy(restart_on=frozenset({FailureClass.EXIT})))
    report, said = run([sh("kill -SEGV $$")], wakeup, tmp_path, 5, opts)
    assert (report.status, report.restarts) == (139, 0)
    assert report.recovery == ("gpulaunch: rank 0 SIGSEGV; not restarting: signal is not in "
                               "--restart-on (exit)")  # fmt: skip
    assert said == []


def test_restart_then_success(wakeup: tuple[int, socket.socket], tmp_path: Path) -> None:
    marker = tmp_path / "failed-once"
    script = sh(f"[ -e {marker} ] && exit 0; touch {marker}; exit 4")
    report, said = run([script], wakeup, tmp_path, 2, RecoveryOptions())
    assert (report.status, report.cause, report.restarts) == (0, Cause.SUCCEEDED, 1)
    assert said == ["gpulaunch: rank 0 exit 4; restarting all ranks (restart 1 of 2)"]


def send_when(path: Path | list[Path], sock: socket.socket, signum: int) -> threading.Thread:
    """SIGTERM to the watcher (its wakeup socket) once `path` (every path) exists: the
    ranks run (and have set their traps)."""
    paths = path if isinstance(path, list) else [path]

    def wait() -> None:
        deadline = time.monotonic() + 30
        while not all(p.exists() for p in paths) and time.monotonic() < deadline:
            time.sleep(0.02)
        sock.send(bytes([signum]))

    thread = threading.Thread(target=wait, daemon=True)
    thread.start()
    return thread


# A rank that needs 2 s to save its checkpoint on SIGTERM (the job's --grace is 1 s).
CHECKPOINT = (
    'echo "$GPULAUNCH_PREEMPT_GRACE $GPULAUNCH_PREEMPT_SIGNAL" > {dir}/env.{rank}; '
    'trap \'kill $!; cat "$GPULAUNCH_PREEMPT_DEADLINE_FILE" > {dir}/deadline.{rank}; '
    "sleep 2; echo saved > {dir}/ckpt.{rank}; exit 0' TERM; "
    "touch {dir}/ready.{rank}; sleep 60 & wait; kill $!"
)


def test_preemption_gives_the_ranks_their_grace(
    wakeup: tuple[int, socket.socket], tmp_path: Path
) -> None:
    scripts = [sh(CHECKPOINT.format(dir=tmp_path, rank=i)) for i in (0, 1)]
    opts = RecoveryOptions(preempt=PreemptPolicy(grace=15.0))
    # both traps set: a rank still starting under load would die of the SIGTERM unsaved
    send_when([tmp_path / "ready.0", tmp_path / "ready.1"], wakeup[1], signal.SIGTERM)
    before = time.time()
    report, said = run(scripts, wakeup, tmp_path, 3, opts)
    assert (report.status, report.cause, report.restarts) == (PREEMPTED_STATUS, Cause.PREEMPTED, 0)
    for rank in (0, 1):  # saved: 2 s after SIGTERM, beyond --grace 1
        assert (tmp_path / f"ckpt.{rank}").read_text() == "saved\n"
        assert (tmp_path / f"env.{rank}").read_text() == "15 SIGTERM\n"
        deadline = float((tmp_path / f"deadline.{rank}").read_text())  # written before the signal
        assert before + 15 - 0.001 <= deadline <= time.time() + 15
    assert all(r.exit is not None and r.exit.stopped_by_watcher for r in report.ranks)
    assert [r.exit.code for r in report.ranks if r.exit] == [0, 0]
    assert said[-1].startswith("gpulaunch: SIGTERM: preempted; the ranks get SIGTERM and 15 s")
    assert "preempted (status 79: requeue it)" in format_report(report)
    assert no_children_left()


def test_preemption_deadline_kills(wakeup: tuple[int, socket.socket], tmp_path: Path) -> None:
    """A rank still running at the deadline is killed; the job is still preempted."""
    ready = tmp_path / "ready"
    sd = FakeSystemd()  # (its stop takes the units away: the kill is seen in its calls)
    spec, units = make_job([sh(f"trap '' USR1 TERM; touch {ready}; sleep 4")])
    opts = RecoveryOptions(preempt=PreemptPolicy(grace=1.0, signal=signal.SIGUSR1))
    send_when(ready, wakeup[1], signal.SIGTERM)
    watcher = Watcher(
        spec, SystemdSupervisor(sd, units), wakeup[0], runtime_dir=tmp_path, recovery=opts
    )
    report = watcher.run()
    assert (report.status, report.cause) == (PREEMPTED_STATUS, Cause.PREEMPTED)
    assert sd.calls.index(("kill", units.ranks[0].name)) > sd.calls.index(
        ("stop", units.ranks_slice.name)
    )


def test_without_preempt_grace_sigterm_stops_as_ever(
    wakeup: tuple[int, socket.socket], tmp_path: Path
) -> None:
    script = sh(CHECKPOINT.format(dir=tmp_path, rank=0))
    send_when(tmp_path / "ready.0", wakeup[1], signal.SIGTERM)
    report, _ = run([script], wakeup, tmp_path, 0, RecoveryOptions())
    assert (report.status, report.cause) == (143, Cause.INTERRUPTED)
    assert (tmp_path / "env.0").read_text() == " \n"  # no preemption variables


# Rank 1 takes its time to stop (its SIGTERM handler writes term.1, then 0.5 s of work);
# rank 0 fails with exit 3 once rank 1 runs: a restart is due while the gang stops.
SLOW_STOP = (
    "trap 'touch {dir}/term.1; sleep 0.5; kill $!; exit 0' TERM; "
    "touch {dir}/ready.1; sleep 60 & wait"
)
FAIL_AFTER = "while [ ! -e {dir}/ready.1 ]; do sleep 0.01; done; echo 0 >> {dir}/attempts; exit 3"


def test_an_interrupt_during_a_restarts_gang_stop_ends_the_job(
    wakeup: tuple[int, socket.socket], tmp_path: Path
) -> None:
    """issue 35 item 8: a SIGTERM while the gang stops for a restart wins: 143, no restart."""
    scripts = [sh(FAIL_AFTER.format(dir=tmp_path)), sh(SLOW_STOP.format(dir=tmp_path))]
    send_when(tmp_path / "term.1", wakeup[1], signal.SIGTERM)
    report, said = run(scripts, wakeup, tmp_path, 2, RecoveryOptions())
    assert (report.status, report.cause, report.restarts) == (143, Cause.INTERRUPTED, 0)
    assert report.interrupt_signal == signal.SIGTERM
    assert (tmp_path / "attempts").read_text().split() == ["0"]  # nothing restarted
    assert "stopped by SIGTERM (status 143)" in format_report(report)
    assert report.recovery == (
        "gpulaunch: rank 0 exit 3; not restarting: the job was interrupted while its ranks stopped"
    )
    assert not any("restarting all ranks" in line for line in said)
    assert [r.exit.code for r in report.ranks if r.exit] == [3, 0]  # rank 1 had its grace
    assert no_children_left()


def test_a_preemption_during_a_restarts_gang_stop_ends_the_job_preempted(
    wakeup: tuple[int, socket.socket], tmp_path: Path
) -> None:
    """The same with --preempt-grace: 79 (a scheduler requeues it), no restart."""
    scripts = [sh(FAIL_AFTER.format(dir=tmp_path)), sh(SLOW_STOP.format(dir=tmp_path))]
    opts = RecoveryOptions(preempt=PreemptPolicy(grace=15.0))
    send_when(tmp_path / "term.1", wakeup[1], signal.SIGTERM)
    report, said = run(scripts, wakeup, tmp_path, 2, opts)
    assert (report.status, report.cause, report.restarts) == (PREEMPTED_STATUS, Cause.PREEMPTED, 0)
    assert (tmp_path / "attempts").read_text().split() == ["0"]
    assert "preempted (status 79: requeue it)" in format_report(report)
    assert any("SIGTERM: preempted while the ranks stop" in line for line in said)
    assert [r.exit.code for r in report.ranks if r.exit] == [3, 0]
    assert no_children_left()
