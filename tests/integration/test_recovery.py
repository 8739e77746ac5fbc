"""Restarts by failure class, crash loops and preemption with a real systemd (issue 25,
items 3-5; gpulaunch/recovery/). The Slurm side: tests/integration/test_recovery_slurm.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.integration.jobs import Job, assert_clean

pytestmark = pytest.mark.integration

CHECKPOINT = str(Path(__file__).parent / "scripts" / "checkpoint.py")


def attempts(job: Job) -> set[int]:
    """The attempts (TORCHELASTIC_RESTART_COUNT) whose ranks began (a rank that fails at once
    may stop the other before it wrote its line)."""
    return {int(line.split(":")[1]) for line in (job.dir / "attempts").read_text().split()}


def test_crash_loop_stops_after_k_attempts(job: Job) -> None:
    """--max-restarts 10, rank 1 exits 3 at once every time: 3 attempts, then status 80."""
    res = job.run("--nproc", "2", "--max-restarts", "10", script=CHECKPOINT, script_args=[
        "--exit", "3"])  # fmt: skip
    assert res.returncode == 80, res.stderr
    assert attempts(job) == {0, 1, 2}
    assert "restarting all ranks (restart 2 of 10)" in res.stderr
    assert "not restarting: a crash loop: 3 attempts in a row failed this way" in res.stderr
    assert res.stderr.count("not restarting") == 1, res.stderr  # once, not before the report
    assert "up to 10 restarts (--max-restarts), but 3 attempts in a row" in res.stderr  # at start
    assert f"job {job.id} failed in a crash loop (--crash-loop): rank " in res.stderr
    record = job.record()
    assert (record["GPULAUNCH_CAUSE"], record["GPULAUNCH_STATUS"]) == ("crash-loop", "80")
    assert_clean(job)


def test_do_not_restart_exit_code_ends_at_once(job: Job) -> None:
    res = job.run("--nproc", "2", "--max-restarts", "5", script=CHECKPOINT, script_args=[
        "--exit", "78"])  # fmt: skip
    assert res.returncode == 78, res.stderr
    assert attempts(job) == {0}
    assert "exit 78 says do not restart (--no-restart-exit-code)" in res.stderr
    assert "restarting all ranks" not in res.stderr
    assert_clean(job)


def test_a_hang_restarts_and_the_next_attempt_succeeds(job: Job) -> None:
    """--hang-timeout 2 --max-restarts 1: attempt 0 hangs (silent, idle), is restarted (a
    hang is restarted by default), attempt 1 exits 0: the job succeeded, not hung."""
    res = job.run("--nproc", "1", "--hang-timeout", "2", "--max-restarts", "1",
                  script=CHECKPOINT, script_args=["--succeed-from", "1"], timeout=300)  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert attempts(job) == {0, 1}
    assert "the job hung (--hang-timeout); restarting all ranks (restart 1 of 1)" in res.stderr
    assert f"job {job.id} succeeded" in res.stderr, res.stderr
    assert_clean(job)


def preempt(
    job: Job, *opts: str, save: float = 6.0
) -> tuple[subprocess.CompletedProcess[str], float]:
    """Two ranks that need `save` s to save; SIGTERM to gpulaunch once both run."""
    proc = job.popen(
        "--nproc", "2", "--grace", "1", *opts, script=CHECKPOINT, script_args=["--save", str(save)]
    )  # fmt: skip
    for rank in (0, 1):
        job.wait_file(f"ready{rank}")
    sent = time.monotonic()
    os.kill(job.box.inner_pid(proc), signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    took = time.monotonic() - sent
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err), took


@pytest.mark.parametrize("supervisor", ["systemd", "direct"])
def test_preemption_lets_ranks_save_their_checkpoint(job: Job, supervisor: str) -> None:
    """--grace 1 --preempt-grace 15: ranks that need 6 s to save finish it; exit 79."""
    opts = ("--preempt-grace", "15", "--max-restarts", "3", "--supervisor", supervisor)
    res, took = preempt(job, *opts)
    print(f"\npreempted: ranks saved for 6 s, gpulaunch exited after {took:.2f} s")
    assert res.returncode == 79, res.stderr
    for rank in (0, 1):
        ckpt = json.loads((job.dir / f"ckpt{rank}.json").read_text())
        assert (ckpt["signal"], ckpt["grace"]) == ("SIGTERM", "15"), ckpt
        assert ckpt["saved_in"] >= 6.0, ckpt
        assert 5.0 < ckpt["deadline_left"] <= 15.01, ckpt  # told of its deadline (ms in the file)
    assert 6.0 <= took < 15.0 + 30, took  # not killed at --grace, not waiting to the deadline
    assert "SIGTERM: preempted; the ranks get SIGTERM and 15 s (--preempt-grace)" in res.stderr
    assert f"job {job.id} preempted (status 79: requeue it)" in res.stderr
    assert "restarting all ranks" not in res.stderr  # a preemption is no failure: no restart
    record = job.record()
    assert (record["GPULAUNCH_CAUSE"], record["GPULAUNCH_STATUS"]) == ("preempted", "79")
    assert all(r["stopped_by_watcher"] for r in json.loads(record["GPULAUNCH_RANKS"]))
    assert attempts(job) == {0}
    assert_clean(job)


def test_what_runs_at_the_preemption_deadline_is_killed(job: Job) -> None:
    """Ranks that would need 60 s get --preempt-grace 3: killed then, still preempted (79)."""
    res, took = preempt(job, "--preempt-grace", "3", save=60)
    assert res.returncode == 79, res.stderr
    assert not list(job.dir.glob("ckpt*.json"))
    assert 3.0 <= took < 3.0 + 30, took
    assert_clean(job)


def test_without_preempt_grace_the_checkpoint_is_cut_at_grace(job: Job) -> None:
    """The same without --preempt-grace: SIGKILL after --grace 1, no checkpoint, 143."""
    res, _ = preempt(job)
    assert res.returncode == 143, res.stderr
    assert not list(job.dir.glob("ckpt*.json"))
    assert_clean(job)


@pytest.mark.parametrize("supervisor", ["systemd", "direct"])
@pytest.mark.parametrize("preempt_grace", [None, "15"])
def test_an_interrupt_during_a_restarts_gang_stop_wins(
    job: Job, supervisor: str, preempt_grace: str | None
) -> None:
    """issue 35 item 8: rank 1 exits 3 (--max-restarts 2), rank 0 takes 3 s to stop; SIGTERM
    to gpulaunch while it stops: 143 (79 with --preempt-grace), rank 0 saved within its
    grace, nothing restarted, the report names the signal."""
    opts = ["--nproc", "2", "--max-restarts", "2", "--grace", "10", "--supervisor", supervisor]
    opts += ["--preempt-grace", preempt_grace] if preempt_grace else []
    proc = job.popen(*opts, script=CHECKPOINT, script_args=[
        "--save", "3", "--exit", "3", "--exit-rank", "1"])  # fmt: skip
    job.wait_file("term0")  # rank 1 failed, the gang stops: rank 0 got its SIGTERM
    os.kill(job.box.inner_pid(proc), signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == (79 if preempt_grace else 143), err
    assert attempts(job) == {0}
    assert "restarting all ranks" not in err
    assert "not restarting: the job was interrupted while its ranks stopped" in err
    assert err.count("not restarting") == 1, err
    ckpt = json.loads((job.dir / "ckpt0.json").read_text())  # not SIGKILLed: it saved
    assert ckpt["saved_in"] >= 3.0, ckpt
    record = job.record()
    if preempt_grace:
        assert f"job {job.id} preempted (status 79: requeue it)" in err
        assert "SIGTERM: preempted while the ranks stop" in err
        assert ckpt["grace"] == "15", ckpt  # told of the preemption's grace
        assert (record["GPULAUNCH_CAUSE"], record["GPULAUNCH_STATUS"]) == ("preempted", "79")
    else:
        assert f"job {job.id} stopped by SIGTERM (status 143)" in err
        assert (record["GPULAUNCH_CAUSE"], record["GPULAUNCH_STATUS"]) == ("interrupted", "143")
    assert_clean(job)
