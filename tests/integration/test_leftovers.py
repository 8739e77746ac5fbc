"""What a SIGKILLed watcher leaves under systemd that systemd does not remove (issue 22
item 13): its error-file directory (/run/gpulaunch/<job>.<random>/). The anchor ends the
job's units; the next start removes the directories of watchers that are gone."""

from __future__ import annotations

import os
import signal

import pytest

from tests.integration.jobs import Job, assert_clean, wait_until
from tests.integration.test_dbus import start_running

pytestmark = pytest.mark.integration


def error_dirs(job: Job) -> set[str]:
    res = job.box.run(["ls", "/run/gpulaunch"], capture_output=True, text=True)
    return {n for n in res.stdout.split() if n.startswith(job.names.component + ".")}


def test_the_next_start_removes_a_sigkilled_watchers_error_dir(job: Job) -> None:
    proc = start_running(job, 1)
    left = error_dirs(job)
    assert len(left) == 1, left
    os.kill(job.box.inner_pid(proc), signal.SIGKILL)
    proc.wait(timeout=60)
    wait_until(lambda: not job.units(), 30, "the anchor to stop the job's units")
    assert error_dirs(job) == left  # nothing of ours ran to remove it
    res = job.run("--nproc", "1", script_args=["--sleep", "0"])
    assert res.returncode == 0, res.stderr
    assert error_dirs(job) == set()
    assert_clean(job)
