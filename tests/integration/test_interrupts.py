"""How a job ends when something other than its ranks ends it (issue 13, items 5, 6, 13).

A stop of the job's units from outside and `gpulaunch stop` interrupt the job:
no rank is its cause. A signal that comes after the report cannot change the
exit status. A rank's leftover that holds its output does not delay a success.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time

import pytest

from sdbox.box import BoxError
from tests.integration.jobs import GPULAUNCH, Job, assert_clean, new_job, wait_until

pytestmark = pytest.mark.integration

REPEAT = 8  # each of these was wrong most of the time before the fix


def running(job: Job, nproc: int = 2) -> subprocess.Popen[str]:
    proc = job.popen("--nproc", str(nproc), script_args=["--sleep", "300", "--grandchild"])
    for rank in range(nproc):
        job.wait_file(f"rank{rank}.ready")
    return proc


def assert_interrupted_by(job: Job, proc: subprocess.Popen[str], by: str) -> None:
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err
    assert f"job {job.id} stopped by {by} (status 143)" in err, err
    assert " cause " not in err and "'s error" not in err, err
    entry = job.record()
    assert (entry["GPULAUNCH_CAUSE"], entry["GPULAUNCH_STATUS"]) == ("interrupted", "143")
    assert entry["GPULAUNCH_INTERRUPTED_BY"] == by
    assert "GPULAUNCH_CAUSE_RANK" not in entry and "GPULAUNCH_CAUSE_ERROR" not in entry
    assert all(r["stopped_by_watcher"] for r in json.loads(entry["GPULAUNCH_RANKS"]))
    assert_clean(job)


def test_stop_of_the_job_slice_from_outside(job: Job) -> None:
    for i in range(REPEAT):
        each = job if i == 0 else new_job(job.box, f"outside{i}")
        try:
            proc = running(each)
            each.box.run(["systemctl", "stop", each.names.job_slice], check=True)
            assert_interrupted_by(each, proc, f"a stop of {each.names.job_slice} from outside")
        finally:
            each.stop()


def test_stop_of_the_ranks_slice_from_outside(job: Job) -> None:
    proc = running(job)
    job.box.run(["systemctl", "stop", job.names.ranks_slice], check=True)
    assert_interrupted_by(job, proc, f"a stop of {job.names.ranks_slice} from outside")


def test_gpulaunch_stop(job: Job) -> None:
    proc = running(job)
    res = job.box.run([GPULAUNCH, "stop", job.id], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert_interrupted_by(job, proc, "gpulaunch stop")


def test_a_late_signal_does_not_change_the_status(job: Job) -> None:
    """SIGTERM the moment the report's headline appears: the status stays the reported one."""
    for i in range(REPEAT):
        each = job if i == 0 else new_job(job.box, f"late{i}")
        try:
            proc = each.popen("--nproc", "1", "--quiet")
            assert proc.stderr is not None
            lines = []
            for line in proc.stderr:
                lines.append(line)
                if "succeeded" in line:
                    try:
                        os.kill(each.box.inner_pid(proc), signal.SIGTERM)
                    except BoxError:  # it exited before the test could signal it (load)
                        pass
                    except ProcessLookupError:
                        pass
                    break
            _, rest = proc.communicate(timeout=60)
            assert proc.returncode == 0, "".join(lines) + rest
            assert each.record()["GPULAUNCH_STATUS"] == "0"
        finally:
            each.stop()


def test_leftover_holding_the_output_does_not_delay_a_success(job: Job) -> None:
    """Before: the watcher waited --grace for the leftover, then stopped it (up to 2 x grace)."""
    grace = 60
    started = time.monotonic()
    res = job.run("--nproc", "2", "--grace", str(grace), script_args=["--daemon", "--sleep", "0.2"])
    took = time.monotonic() - started
    assert res.returncode == 0, res.stderr
    assert took < grace / 2, f"{took:.1f}s for a 0.2s job"  # about a second, on a loaded machine
    assert {"rank0-daemon", "rank1-daemon"} <= set(job.pids())
    assert_clean(job)


def test_sighup_stops_a_running_job_with_129(job: Job) -> None:
    """README's exit-status table: SIGHUP (the terminal went away) stops the ranks as SIGTERM
    does and the job's status is 129, told in the report and the record."""
    proc = running(job)
    os.kill(job.box.inner_pid(proc), signal.SIGHUP)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 129, err
    assert f"job {job.id} stopped by SIGHUP (status 129)" in err, err
    entry = job.record()
    assert (entry["GPULAUNCH_CAUSE"], entry["GPULAUNCH_STATUS"]) == ("interrupted", "129")
    assert all(r["stopped_by_watcher"] for r in json.loads(entry["GPULAUNCH_RANKS"]))
    assert_clean(job)


def test_a_second_signal_kills_at_once(job: Job) -> None:
    """README: "ranks get SIGTERM, then SIGKILL after --grace; a second signal kills them at
    once". Ranks that ignore SIGTERM and a grace of 300 s: after the first SIGTERM their
    scopes are stopping (and stay so); a second SIGTERM ends them by SIGKILL well within the
    grace, and the status is still the first signal's."""
    proc = job.popen(
        "--nproc", "2", "--grace", "300", script_args=["--sleep", "300", "--ignore-term"]
    )
    for rank in (0, 1):
        job.wait_file(f"rank{rank}.ready")
    scopes = [job.names.rank_scope(r) for r in (0, 1)]
    os.kill(job.box.inner_pid(proc), signal.SIGTERM)
    wait_until(
        lambda: all(job.show(s, "ActiveState") == ["deactivating"] for s in scopes),
        60,
        "the ranks' scopes to be stopping (the first signal heard)",
    )
    assert proc.poll() is None and job.alive() != []  # the grace holds: SIGTERM is ignored
    os.kill(job.box.inner_pid(proc), signal.SIGTERM)
    _, err = proc.communicate(timeout=120)  # far less than the grace
    assert proc.returncode == 143, err
    assert f"job {job.id} stopped by SIGTERM (status 143)" in err, err
    assert len(re.findall(r" SIGKILL +stopped ", err)) == 2, err
    assert_clean(job)
