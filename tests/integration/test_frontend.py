"""An ordinary user's `gpulaunch start` from a login shell: the front end (issue 14).

The user's shell lives where sshd with pam_systemd puts it,
`user.slice/user-UID.slice/session-N.scope` (root's cgroup), reproduced with
`systemd-run --scope --slice=user-UID.slice --unit=session-...`, and runs
`gpulaunch start` through `runuser`, with a lingering user manager. Nothing here
runs inside `user@UID.service`: the user manager cannot adopt these processes.
"""

from __future__ import annotations

import signal
from typing import Any

import pytest

from tests.integration.jobs import GPULAUNCH, Job, wait_until
from tests.integration.shared import Login, assert_user_clean, login, make_user, ujob
from tests.integration.shared import running_from_login as _running

pytestmark = pytest.mark.integration
__all__ = ["login", "ujob"]  # fixtures


def test_start_from_a_login_shell(login: Login, ujob: Job) -> None:
    res = login.run(ujob.argv("--nproc", "2", script_args=["--print"]))
    assert res.returncode == 0, res.stderr
    where = f"0::/user.slice/user-{login.uid}.slice/user@{login.uid}.service/gpulaunch.slice/"
    for rank in range(2):
        assert f"rank {rank} cgroup {where}{ujob.names.job_slice}/{ujob.names.ranks_slice}/" in (
            res.stdout
        )
    assert "succeeded" in res.stderr
    assert_user_clean(login, ujob)


def test_a_failing_rank_from_a_login_shell(login: Login, ujob: Job) -> None:
    res = login.run(
        ujob.argv(
            "--nproc", "3", script_args=["--sleep", "60", "--exit", "1:7", "--fail-after", "0.3"]
        )
    )
    assert res.returncode == 7, res.stderr
    assert "failed: rank 1 exit 7" in res.stderr
    rows = [line.split() for line in res.stderr.splitlines() if line.split()[:1] in (["0"], ["2"])]
    assert all(r[3:5] == ["SIGTERM", "stopped"] for r in rows) and len(rows) == 2
    assert_user_clean(login, ujob)


@pytest.mark.parametrize("signum,status", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_interrupting_the_front_end(login: Login, ujob: Job, signum: int, status: int) -> None:
    proc, pid = _running(login, ujob, 2)
    login.box.run(["kill", f"-{signum}", str(pid)], check=True)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == status, err
    assert f"stopped by {signal.Signals(signum).name} (status {status})" in err
    assert_user_clean(login, ujob)


def test_front_end_killed(login: Login, ujob: Job) -> None:
    proc, pid = _running(login, ujob, 2)
    try:
        login.box.run(["kill", "-KILL", str(pid)], check=True)
        # systemd alone: the front end's bus name goes, the service (the watcher) is stopped
        took = wait_until(lambda: not ujob.alive(), 10, "every rank process to be gone")
        print(f"all rank processes gone {took:.3f}s after SIGKILL of the front end")
    finally:
        proc.kill()
        proc.communicate()
    assert_user_clean(login, ujob)


def test_stop_and_logs_from_a_second_login(login: Login, ujob: Job) -> None:
    proc, _ = _running(login, ujob, 2)
    stopped = login.run([GPULAUNCH, "stop", ujob.id])
    assert stopped.returncode == 0, stopped.stderr
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err
    assert_user_clean(login, ujob)
    logs = login.run(
        ["journalctl", "--user", "-u", ujob.names.rank_scope(1), "-o", "cat", "--no-pager"]
    )
    assert logs.returncode == 0, logs.stderr
    assert f"rank 1 cgroup 0::/user.slice/user-{login.uid}.slice/" in logs.stdout, logs.stdout


def test_user_without_a_user_manager(box: Any, ujob: Job) -> None:
    """--supervisor systemd: one line, what is missing and what to do. auto: the job runs
    under the direct supervisor, and the start line says why and how to get systemd's."""
    nolinger = make_user(box, "glnolinger", manager=False)
    res = nolinger.run(ujob.argv("--nproc", "1", "--supervisor", "systemd"))
    assert res.returncode == 69, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpulaunch: error: "), res.stderr
    assert f"/run/user/{nolinger.uid}/bus" in lines[0] and "enable-linger" in lines[0]
    assert not ujob.pids()
    res = nolinger.run(ujob.argv("--nproc", "1"))
    assert res.returncode == 0, res.stderr
    line = next(x for x in res.stderr.splitlines() if "direct supervisor" in x)
    assert "no systemd manager answers" in line and "enable-linger" in line, res.stderr
    assert "Traceback" not in res.stderr


def test_detach_from_a_login_shell(login: Login, ujob: Job) -> None:
    res = login.run(ujob.argv("--nproc", "2", "--detach", script_args=["--sleep", "1"]))
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == ujob.id
    # the job outlives the front end, and a second login waits for its status
    waited = login.run([GPULAUNCH, "wait", ujob.id])
    assert waited.returncode == 0, waited.stderr
    assert_user_clean(login, ujob)
