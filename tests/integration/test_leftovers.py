"""What a killed watcher leaves, and what the job tools say afterwards (issue 22 items 3,
5, 9, 13), in the box: under systemd the anchor ends the job's units but not its
error-file directory (/run/gpulaunch/<job>.<random>/), which the next start removes; an
ordinary user's direct job (no user manager) and its keeper; `signal` of an ended job."""

from __future__ import annotations

import os
import shlex
import signal

import pytest

from tests.integration.container import alive_script
from tests.integration.jobs import GPULAUNCH, REPO, Job, assert_clean, wait_until
from tests.integration.shared import start_running

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


def test_an_ordinary_users_direct_job_leaves_nothing_when_its_watcher_is_killed(
    job: Job,
) -> None:
    """Issue 22 items 3 and 5 as an ordinary user without a user manager (the direct
    supervisor, process groups; its record under its own $HOME): the watcher SIGKILLed,
    the keeper ends the ranks' worker, child and daemon and exits 137; `status` says the
    watcher went away (76) instead of "running"; the same id runs again."""
    job.box.run(["chmod", "711", "/root"], check=True)  # Python lives there (the box's overlay)
    os.chmod(job.dir, 0o777)
    home = job.dir / "home"
    home.mkdir(mode=0o700)
    os.chown(home, 65534, 65534)
    user = [
        *("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "env"),
        *("-u", "DBUS_SESSION_BUS_ADDRESS", "XDG_RUNTIME_DIR=/nonexistent", f"HOME={home}"),
    ]
    first = shlex.join(
        [*user, *job.argv("--nproc", "2", script_args=["--sleep", "300", "--worker",
                                                          "--grandchild", "--daemon"])]
    )  # fmt: skip
    status = shlex.join([*user, GPULAUNCH, "status", job.id])
    again = shlex.join([*user, *job.argv("--nproc", "2", script_args=["--sleep", "0"])])
    ready = " && ".join(f"[ -e {job.dir}/rank{r}.ready ]" for r in (0, 1))
    script = (
        f"{first} 2>/dev/null & k=$!; i=0; "
        f"until {ready} || [ $i -gt 1200 ]; do sleep 0.05; i=$((i+1)); done; "
        "w=$(cut -d' ' -f1 /proc/$k/task/$k/children); kill -KILL $w; wait $k; echo rc=$?; "
        f"{status}; echo status=$?; {alive_script(job.dir)}; {again} 2>&1; echo again=$?"
    )
    res = job.box.run(["sh", "-c", script], cwd=str(REPO), capture_output=True, text=True,
                      timeout=180)  # fmt: skip
    out = res.stdout + res.stderr
    assert "rc=137" in out, out
    assert "status=76" in out and "went away without saying how the job ended" in out, out
    assert "ALIVE" not in out, out
    assert "again=0" in out, out
    assert {"rank0-worker", "rank0-child", "rank0-daemon"} <= {
        p.stem for p in job.dir.glob("*.pid")
    }


def test_signal_of_an_ended_job_says_it_ended(job: Job) -> None:
    """Issue 22 item 9 under systemd: the journal's record says how it ended (exit 3),
    not "the journal has no record of it"."""
    res = job.run("--nproc", "1", script_args=["--sleep", "0"])
    assert res.returncode == 0, res.stderr
    sig = job.box.run(
        [GPULAUNCH, "signal", job.id, "USR1"], cwd=str(REPO), capture_output=True, text=True
    )
    assert sig.returncode == 3, sig.stderr
    assert f"job {job.id!r} is not running: it ended" in sig.stderr, sig.stderr
    assert "no record" not in sig.stderr
