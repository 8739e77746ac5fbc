"""Windows of a job's start-up that an outside event can hit (issue 22, items 1 and 12).

The window is held open, not hit by luck: strace delays every write(2) of the watcher
(its gates are pipes it writes one byte to), so the test acts while ranks wait at their
gates, checks that they did, and lets the watcher go on.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.integration.jobs import Job, assert_clean, wait_until
from tests.integration.shared import make_user, record, slice_dir

pytestmark = pytest.mark.integration

STRACE = shutil.which("strace") or "strace"  # scripts/setup.sh installs it for the tests


def delay_writes(pid: int, seconds: float) -> subprocess.Popen[str]:
    """Attach strace to `pid`: each write(2) it makes waits `seconds` first (until detached)."""
    tracer = subprocess.Popen(
        [STRACE, "-o", "/dev/null", "-e", "trace=write",
         "-e", f"inject=write:delay_enter={int(seconds * 1e6)}", "-p", str(pid)],
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert tracer.stderr is not None
    line = tracer.stderr.readline()
    assert "attached" in line, line  # from here on, the watcher's writes wait
    return tracer


def rank_pids(job: Job, rank: int) -> list[int]:
    """The processes in a rank's scope (held: the rank and its log pump), as systemd put them."""
    procs = slice_dir(job) / job.names.ranks_slice / job.names.rank_scope(rank) / "cgroup.procs"
    try:
        return [int(p) for p in procs.read_text().split()]
    except FileNotFoundError:
        return []


def test_an_outside_stop_while_ranks_wait_at_their_gates(job: Job) -> None:
    """`systemctl stop <job slice>` kills ranks that systemd has placed but the watcher has not
    yet let go: opening a dead rank's gate (EPIPE) ended the job in a silent 141, with no
    report and no record. It is a stop from outside: 143, reported and recorded."""
    proc = job.popen("--nproc", "2", script_args=["--sleep", "300"])
    tracer = delay_writes(job.box.inner_pid(proc), 5)  # its 3 lines first: 15 s
    try:
        wait_until(lambda: all(len(rank_pids(job, r)) == 2 for r in range(2)), 60, "placed ranks")
        held = {r: min(rank_pids(job, r)) for r in range(2)}  # the rank; its pump came after
        job.box.run(["systemctl", "stop", "--no-block", job.names.job_slice], check=True)
        wait_until(lambda: all(held[r] not in rank_pids(job, r) for r in range(2)), 60, "deaths")
        assert not list(Path(job.dir).glob("rank*.pid")), "a rank ran: the window was missed"
    finally:
        tracer.send_signal(signal.SIGINT)  # detaches: the delayed writes go on at once
        tracer.communicate(timeout=60)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err
    assert "stopped" in err and "internal error" not in err, err
    final = record(job)
    assert (final["status"], final["cause"]) == (143, "interrupted"), final
    assert_clean(job)


def test_a_front_end_killed_before_it_owns_its_name(box: Any, job: Job) -> None:
    """SIGKILL of the front end after it created the watcher's service, before its bus name
    held the service: the service stayed `activating` and the job ran on, detached, until
    TimeoutStartSec= (90 s). The window is held open: the one message the front end sends with
    file descriptors is StartTransientUnit (its stdin, stdout, stderr), and strace holds the
    front end for 10 s after it sent it."""
    login = make_user(box, "glwindow", manager=True)
    os.chmod(job.dir, 0o777)
    service = job.names.launch_service
    proc = login.popen(job.argv("--nproc", "2", script_args=["--sleep", "300"]))
    front_end = login.frontend_pid(job)  # in the box
    tracer = job.box.popen(
        ["sh", "-c", 'echo $$; exec "$@"', "sh",
         STRACE, "-o", "/dev/null", "-e", "trace=sendmsg",
         "-e", "inject=sendmsg:delay_exit=10000000", "-p", str(front_end)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert tracer.stdout is not None and tracer.stderr is not None
        strace = tracer.stdout.readline().strip()  # its pid in the box
        assert "attached" in tracer.stderr.readline()
        assert service not in login.user_units(), "attached too late: the window was missed"
        for rank in range(2):  # the job runs, its front end held right after creating it
            job.wait_file(f"rank{rank}.ready")
        state = login.box.run(
            ["runuser", "-u", login.user, "--", "env", f"XDG_RUNTIME_DIR=/run/user/{login.uid}",
             "systemctl", "--user", "show", "-p", "ActiveState", "--value", service],
            capture_output=True, text=True,
        ).stdout.strip()  # fmt: skip
        assert state == "activating", f"{state}: the front end's name holds it, window missed"
        job.box.run(["kill", "-KILL", str(front_end)], check=True)
        job.box.run(["kill", "-KILL", strace], check=True)  # a traced process dies once let go
        took = wait_until(lambda: not job.alive(), 45, "every rank process to be gone")
        print(f"all rank processes gone {took:.2f}s after the front end's SIGKILL")
        wait_until(lambda: service not in login.user_units(), 30, f"{service} to go")
    finally:
        tracer.kill()
        proc.kill()
    proc.communicate(timeout=60)  # the watcher held its stdout: it is gone too
