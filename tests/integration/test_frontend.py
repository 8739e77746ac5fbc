"""An ordinary user's `gpulaunch start` from a login shell: the front end (issue 14).

The user's shell lives where sshd with pam_systemd puts it,
`user.slice/user-UID.slice/session-N.scope` (root's cgroup), reproduced with
`systemd-run --scope --slice=user-UID.slice --unit=session-...`, and runs
`gpulaunch start` through `runuser`, with a lingering user manager. Nothing here
runs inside `user@UID.service`: the user manager cannot adopt these processes.
"""

from __future__ import annotations

import os
import signal
import subprocess
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pytest

from tests.integration.jobs import GPULAUNCH, REPO, Job, wait_until

pytestmark = pytest.mark.integration


@dataclass(frozen=True)
class Login:
    """An ordinary user of the box, with a running (lingering) user manager."""

    box: Any
    user: str
    uid: int

    def argv(self, argv: Sequence[str], env: Sequence[str] = ()) -> list[str]:
        """argv in a fresh login session of this user (a session-N.scope of root's)."""
        session = f"session-fake{uuid.uuid4().hex[:8]}"
        return [
            "systemd-run", "--quiet", "--scope", f"--slice=user-{self.uid}.slice",
            f"--unit={session}", "runuser", "-u", self.user, "--",
            "env", f"XDG_RUNTIME_DIR=/run/user/{self.uid}", *env,
            # PAM's 1024 open files kill ranks with 127 (fixed elsewhere): raise it, as users do
            "sh", "-c", 'ulimit -Sn "$(ulimit -Hn)"; exec "$@"', "sh", *argv,
        ]  # fmt: skip

    def run(self, argv: Sequence[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        kw.setdefault("timeout", 120)
        return self.box.run(self.argv(argv), cwd=str(REPO), capture_output=True, text=True, **kw)

    def popen(self, argv: Sequence[str]) -> subprocess.Popen[str]:
        return self.box.popen(
            self.argv(argv), cwd=str(REPO), stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )

    def user_units(self) -> str:
        """Every unit of the user manager named gpulaunch-*, in any state."""
        return self.box.run(
            ["runuser", "-u", self.user, "--", "env", f"XDG_RUNTIME_DIR=/run/user/{self.uid}",
             "systemctl", "--user", "list-units", "--all", "--plain", "--no-legend",
             "gpulaunch-*"],
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip

    def frontend_pid(self, job: Job) -> int:
        """The front end's pid in the box (the watcher's command line has --frontend-child)."""
        # Python running the gpulaunch script, not runuser or sh with it in their argv
        pattern = f"^[^ ]*python[^ ]* [^ ]*/gpulaunch start --job {job.id} "
        out = ""

        def found() -> bool:
            nonlocal out
            out = self.box.run(["pgrep", "-f", "--", pattern], capture_output=True).stdout
            return bool(out.split())

        wait_until(found, 30, f"the front end of {job.id}")
        return int(out.split()[0])


def make_user(box: Any, name: str, *, manager: bool) -> Login:
    from sdbox import Box

    if not isinstance(box, Box):
        pytest.skip("needs the throwaway box: it would add a user to this host")
    if box.run(["id", "-u", name], capture_output=True).returncode != 0:  # one box a session
        box.run(["useradd", "--create-home", name], check=True, capture_output=True)
    # Inside the box's overlay only: let the user reach this Python (pyenv lives under /root).
    box.run(["chmod", "711", "/root"], check=True)
    uid = int(box.run(["id", "-u", name], capture_output=True, text=True, check=True).stdout)
    if manager:  # what `loginctl enable-linger` makes logind do at boot
        box.run(["systemctl", "start", f"user@{uid}.service"], check=True)
    return Login(box=box, user=name, uid=uid)


@pytest.fixture(scope="module")
def login(box: Any) -> Login:
    return make_user(box, "glfront", manager=True)


@pytest.fixture
def ujob(job: Job) -> Job:
    os.chmod(job.dir, 0o777)
    return job


def assert_user_clean(login: Login, job: Job) -> None:
    prefix = f"gpulaunch-{job.names.component}"
    wait_until(
        lambda: prefix not in login.user_units(), 10, f"units of {job.id}: {login.user_units()}"
    )
    assert job.alive() == []


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


def _running(login: Login, job: Job, nproc: int) -> tuple[subprocess.Popen[str], int]:
    proc = login.popen(job.argv("--nproc", str(nproc), script_args=["--sleep", "300", "--print"]))
    for rank in range(nproc):
        job.wait_file(f"rank{rank}.ready")
    return proc, login.frontend_pid(job)


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
    # the record says what stopped it (issue 35), not "stopped by SIGTERM"
    status = login.run([GPULAUNCH, "status", ujob.id])
    said = f"stopped by the death of its launcher (pid {pid}) (status 143)"
    assert said in status.stdout + status.stderr, status


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
