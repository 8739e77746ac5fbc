"""`gpulaunch start` against a real systemd: topology, gang fail-fast, exit statuses, cleanup."""

from __future__ import annotations

import hashlib
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from gpulaunch.base.names import UnitNames
from tests.integration.jobs import GPULAUNCH, RANK_SCRIPT, REPO, Job, assert_clean, wait_until

pytestmark = pytest.mark.integration

RANK = RANK_SCRIPT
NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]


def test_all_ranks_succeed(job: Job) -> None:
    res = job.run("--nproc", "4", script_args=["--print"])
    assert res.returncode == 0, res.stderr
    # each rank ran in its own scope inside the job's ranks slice
    for rank in range(4):
        cgroup = (
            f"0::/gpulaunch.slice/{job.names.job_slice}/{job.names.ranks_slice}/"
            f"{job.names.rank_scope(rank)}"
        )
        assert f"rank {rank} cgroup {cgroup}" in res.stdout
    assert "succeeded" in res.stderr
    assert_clean(job)


def test_failing_rank_stops_the_others(job: Job) -> None:
    res = job.run(
        "--nproc", "4", script_args=["--sleep", "60", "--exit", "2:7", "--fail-after", "0.5"]
    )
    ended = time.time()
    assert res.returncode == 7, res.stderr
    failed_at = float((job.dir / "rank2.failed").read_text())
    # The others sleep 60 s: ending long before that means they were stopped (the
    # bound leaves room for a loaded 2-CPU machine; bench/ measures the real time).
    assert failed_at < ended < failed_at + 30
    report = res.stderr.splitlines()
    headline = next(i for i, line in enumerate(report) if "failed: rank 2 exit 7" in line)
    # the cause line comes first in the table, the others were stopped by the watcher
    rows = [line.split() for line in report[headline + 2 : headline + 6]]
    assert rows[0][0] == "2" and rows[0][3:6] == ["exit", "7", "cause"]
    assert sorted(r[0] for r in rows[1:]) == ["0", "1", "3"]
    assert all(r[3:5] == ["SIGTERM", "stopped"] for r in rows[1:])
    assert_clean(job)


def test_rank_killed_by_sigkill(job: Job) -> None:
    res = job.run(
        "--nproc", "2", script_args=["--sleep", "60", "--kill", "1:9", "--fail-after", "0.2"]
    )
    assert res.returncode == 137, res.stderr
    assert re.search(r"failed: rank 1 SIGKILL \(status 137\)", res.stderr)
    assert_clean(job)


def test_watcher_sigkill_leaves_nothing(job: Job) -> None:
    proc = job.popen("--nproc", "3", script_args=["--sleep", "300", "--grandchild", "--daemon"])
    try:
        for rank in range(3):
            job.wait_file(f"rank{rank}.ready")
        assert len(job.alive()) == 9  # 3 ranks, 3 children, 3 daemons
        os.kill(job.box.inner_pid(proc), signal.SIGKILL)
        # systemd stops the ranks' scopes (BindsTo=): an event of systemd's, not a time; a
        # scope is gone once its cgroup is empty, then no process may be left (a zombie is
        # one until reaped). Bounds for a loaded machine; the time is printed (README's bench
        # row 2 measures it: tens of ms).
        took = wait_until(lambda: not job.units(), 30, "systemd to stop the job's units")
        took += wait_until(lambda: not job.alive(), 10, "every process to be gone")
        print(f"all rank processes gone {took:.3f}s after SIGKILL of the watcher")
    finally:
        proc.kill()
        proc.communicate()
    assert_clean(job)


def test_grandchildren_are_gone_when_the_job_ends(job: Job) -> None:
    # The daemons keep the ranks' output open: the watcher stops them when the ranks are done.
    res = job.run(
        "--nproc", "2", "--grace", "1", script_args=["--grandchild", "--daemon", "--sleep", "0.2"]
    )
    assert res.returncode == 0, res.stderr
    assert set(job.pids()) == {f"rank{r}{s}" for r in range(2) for s in ("", "-child", "-daemon")}
    assert_clean(job)


def test_sigterm_to_watcher(job: Job) -> None:
    proc = job.popen("--nproc", "2", script_args=["--sleep", "300", "--grandchild"])
    for rank in range(2):
        job.wait_file(f"rank{rank}.ready")
    os.kill(job.box.inner_pid(proc), signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 143, err
    assert "stopped by SIGTERM (status 143)" in err
    assert_clean(job)


def test_sigint_to_watcher(job: Job) -> None:
    proc = job.popen("--nproc", "2", script_args=["--sleep", "300"])
    for rank in range(2):
        job.wait_file(f"rank{rank}.ready")
    os.kill(job.box.inner_pid(proc), signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert_clean(job)


def test_rank_ignoring_sigterm_is_killed_after_the_grace(job: Job) -> None:
    res = job.run(
        "--nproc",
        "2",
        "--grace",
        "1",
        script_args=["--sleep", "300", "--ignore-term", "--exit", "0:3", "--fail-after", "0.3"],
    )
    assert res.returncode == 3, res.stderr
    line = next(line for line in res.stderr.splitlines() if line.split()[:1] == ["1"])
    assert "SIGKILL" in line and "stopped" in line
    # killed after about the grace, not at once and not after systemd's default 90 s
    runtime = float(next(t for t in line.split()[4:] if re.fullmatch(r"[0-9.]+s", t))[:-1])
    assert 1.0 <= runtime < 10
    assert_clean(job)


def test_status_shows_the_tree_while_running(job: Job) -> None:
    proc = job.popen("--nproc", "2", script_args=["--sleep", "300"])
    try:
        for rank in range(2):
            job.wait_file(f"rank{rank}.ready")
        out = job.box.run(
            ["systemctl", "status", "--no-pager", job.names.job_slice],
            capture_output=True,
            text=True,
        ).stdout
        for unit in (
            job.names.watcher_scope,
            job.names.ranks_slice,
            *map(job.names.rank_scope, (0, 1)),
        ):
            assert unit in out
        assert out.count("rank.py") >= 2 and "gpulaunch start" in out
        assert job.show(job.names.rank_scope(1), "BindsTo") == [job.names.watcher_scope]
        assert job.names.watcher_scope in job.show(job.names.rank_scope(1), "After")
        assert job.show(job.names.watcher_scope, "PropagatesStopTo") == [job.names.job_slice]
    finally:
        os.kill(job.box.inner_pid(proc), signal.SIGTERM)
        proc.communicate(timeout=30)
    assert_clean(job)


def test_ddp_example_fails_fast(job: Job) -> None:
    start = time.monotonic()
    res = job.box.run(
        [
            GPULAUNCH,
            "start",
            "--nproc",
            "4",
            "--job",
            job.id,
            "examples/ddp_train.py",
            "--steps",
            "200",
            "--fail-rank",
            "2",
            "--fail-step",
            "3",
            "--step-sleep",
            "0.05",
        ],
        cwd=str(REPO),
        capture_output=True,
        text=True,
        timeout=300,
    )
    took = time.monotonic() - start
    assert res.returncode == 1, res.stderr[-3000:]
    assert "failed: rank 2 exit 1" in res.stderr
    assert "rank 2 failed on purpose in step 3" in res.stderr
    assert took < 120  # the collective timeout is 30 minutes: this is "in seconds"
    assert_clean(job)


@pytest.mark.parametrize("name", ["has-dash", "with space/and slash", "ünïcødé-名前", "a\\x2db"])
def test_odd_job_names(box: object, name: str, job: Job) -> None:
    job.id = name + "-" + job.id
    res = job.run("--nproc", "2", script_args=["--print"])
    assert res.returncode == 0, res.stderr
    assert f"{job.names.job_slice}/{job.names.ranks_slice}/{job.names.rank_scope(1)}" in res.stdout
    assert_clean(job)


def test_second_job_with_the_same_name_is_refused(job: Job) -> None:
    proc = job.popen("--nproc", "1", script_args=["--sleep", "300"])
    try:
        job.wait_file("rank0.ready")
        # two ranks: the OMP_NUM_THREADS warning would apply, but a refused start warns of nothing
        res = job.run("--nproc", "2")
        assert res.returncode == 73
        assert res.stderr.count("\n") == 1 and "already running" in res.stderr, res.stderr
        assert "Traceback" not in res.stderr
    finally:
        os.kill(job.box.inner_pid(proc), signal.SIGTERM)
        proc.communicate(timeout=30)
    assert_clean(job)


@pytest.mark.parametrize(
    ("argv", "code", "message"),
    [
        (
            ["start", "--nproc", "2", "does-not-exist.py"],
            2,
            "script does-not-exist.py does not exist",
        ),
        (
            ["start", "--nproc", "0", "tests/integration/scripts/rank.py"],
            2,
            "--nproc/--nproc-per-node/--nproc_per_node: must be between 1 and 16384, not 0",
        ),
        (["start", "--grace", "soon", "x.py"], 2, "not a number of seconds"),
        (["start", "--bogus", "x.py"], 2, "unrecognized arguments: --bogus"),
        (["frobnicate"], 2, "invalid choice: 'frobnicate'"),
        (["start", "--job", "a\nb", "tests/integration/scripts/rank.py"], 2, "control characters"),
        # issue 13 item 10: each of these failed later, with 78 or 70, or was ignored
        (["start", "--job", "{job}", "--grace", "nan", RANK], 2, "--grace must be between 0"),
        (["start", "--job", "{job}", "--grace", "1e308", RANK], 2, "--grace must be between 0"),
        (["start", "--job", "{job}", "--log-dir", "/etc/passwd", RANK], 2, "not a directory"),
        (["start", "--job", "{job}", "--log-dir", "/etc/passwd/x", RANK], 2, "not a directory"),
        (["start", "--job", "{job}", "--log-dir", "/proc/1/x", RANK], 2, "cannot create"),
        (["start", "--job", "{job}", "--units-dir", "/nonexistent", RANK], 2, "does not exist"),
        (["start", "--job", "{job}\udcff", RANK], 2, "the job id is not valid UTF-8"),
    ],
)
def test_bad_input(box: object, job: Job, argv: list[str], code: int, message: str) -> None:
    argv = [a.replace("{job}", job.id) for a in argv]
    res = job.box.run([GPULAUNCH, *argv], cwd=str(REPO), capture_output=True, text=True)
    assert res.returncode == code, res.stderr
    assert res.stderr.startswith("gpulaunch: error: ") and message in res.stderr
    assert res.stderr.count("\n") == 1, res.stderr
    assert not job.units() and not list(job.dir.iterdir())  # nothing started
    assert not any(
        u
        for u in job.box.run(
            ["systemctl", "list-units", "--all", "--plain", "--no-legend", "gpulaunch-*"],
            capture_output=True,
            text=True,
        ).stdout.splitlines()
        if "frobnicate" in u or "does\\x2dnot" in u
    )


def test_log_dir_the_user_cannot_create(job: Job) -> None:
    locked = job.dir / "locked"
    locked.mkdir(mode=0o555)
    os.chmod(job.dir, 0o777)
    res = job.box.run(
        [*NOBODY, *job.argv("--nproc", "1", "--log-dir", str(locked / "logs"))],
        cwd=str(REPO),
        capture_output=True,
        text=True,
    )
    assert res.returncode == 2, res.stderr
    assert res.stderr.count("\n") == 1 and f"cannot create {locked}/logs in {locked}" in res.stderr
    assert list(locked.iterdir()) == [] and not job.units()


def test_ids_that_spelled_each_others_unit_names_run_side_by_side(job: Job) -> None:
    # issue 13 item 11: a long id was named <head>_<16 hex>, and a 227-character id could
    # spell exactly that: the second job was refused (73) and `logs` showed the other's lines.
    long_id = job.id.replace("-", "_") + "L" * 300
    long_id = long_id[:300]
    spelled = long_id[:210] + "_" + hashlib.sha256(long_id.encode()).hexdigest()[:16]
    a_dir, b_dir = job.dir / "a", job.dir / "b"
    a_dir.mkdir()
    b_dir.mkdir()

    def argv(job_id: str, d: Path, *script_args: str) -> list[str]:
        return [GPULAUNCH, "start", "--job", job_id, "--nproc", "1", RANK, "--dir", str(d),
                *script_args]  # fmt: skip

    a = job.box.popen(
        argv(long_id, a_dir, "--sleep", "300", "--print"),
        cwd=str(REPO),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_until(lambda: (a_dir / "rank0.ready").exists(), 60, "job a's rank")
        b = job.box.run(
            argv(spelled, b_dir, "--print"), cwd=str(REPO), capture_output=True, text=True
        )
        assert b.returncode == 0, b.stderr
        b_names, a_names = UnitNames.for_job(spelled), UnitNames.for_job(long_id)
        assert b_names.job_slice != a_names.job_slice
        assert f"cgroup 0::/gpulaunch.slice/{b_names.job_slice}/" in b.stdout
        for job_id, mine, other in ((spelled, b_names, a_names), (long_id, a_names, b_names)):
            logs = job.box.run([GPULAUNCH, "logs", job_id], capture_output=True, text=True)
            assert logs.returncode == 0, logs.stderr
            assert f"/{mine.job_slice}/" in logs.stdout and other.job_slice not in logs.stdout
    finally:
        os.kill(job.box.inner_pid(a), signal.SIGTERM)
        a.communicate(timeout=60)
    assert a.returncode == 143


def test_no_system_bus_reachable(job: Job) -> None:
    """Root reaches systemd on its private socket, but a system job's API needs the bus."""
    env = dict(os.environ, DBUS_SYSTEM_BUS_ADDRESS="unix:path=/nonexistent/bus")
    res = job.box.run(
        job.argv("--nproc", "2", "--system"), cwd=str(REPO), capture_output=True, text=True, env=env
    )
    assert res.returncode == 69, res.stderr
    lines = res.stderr.splitlines()
    assert [x for x in lines if x.startswith("gpulaunch: error: ")] == lines[-1:], res.stderr
    assert "cannot reach the system bus at unix:path=/nonexistent/bus" in lines[-1]
    assert "Traceback" not in res.stderr
    assert not job.pids()  # no rank was started
    assert_clean(job)


def test_access_denied_for_unprivileged_user_on_the_system_manager(job: Job) -> None:
    os.chmod(job.dir, 0o777)
    job.box.run(["chmod", "711", "/root"], check=True)  # nobody reaches this Python (the overlay)
    res = job.box.run(
        [
            "setpriv",
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            *job.argv("--nproc", "1", "--system"),
        ],
        cwd=str(REPO),
        capture_output=True,
        text=True,
    )
    assert res.returncode == 77, res.stderr
    assert "access denied" in res.stderr and "--user" in res.stderr
    assert "Traceback" not in res.stderr
    assert_clean(job)


def test_python_m_gpulaunch_works(job: Job) -> None:
    import sys

    res = job.box.run(
        [
            sys.executable,
            "-m",
            "gpulaunch",
            "start",
            "--nproc",
            "2",
            "--job",
            job.id,
            "tests/integration/scripts/rank.py",
            "--dir",
            str(job.dir),
        ],
        cwd=str(REPO),
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0, res.stderr
    assert_clean(job)


@pytest.fixture(scope="module")
def box_user(box: object) -> tuple[int, dict[str, str]]:
    """An ordinary user with a running user manager, inside the box only."""
    from sdbox import Box

    if not isinstance(box, Box):
        pytest.skip("needs the throwaway box: it would add a user to this host")
    if box.run(["id", "-u", "gltest"], capture_output=True).returncode != 0:  # one box a session
        box.run(["useradd", "--create-home", "gltest"], check=True, capture_output=True)
    # Inside the box's overlay only: let the user reach this Python (pyenv lives under /root).
    box.run(["chmod", "711", "/root"], check=True)
    uid = int(box.run(["id", "-u", "gltest"], capture_output=True, text=True, check=True).stdout)
    box.run(["systemctl", "start", f"user@{uid}.service"], check=True)
    env = {
        "HOME": "/home/gltest",
        "XDG_RUNTIME_DIR": f"/run/user/{uid}",
        "DBUS_SESSION_BUS_ADDRESS": f"unix:path=/run/user/{uid}/bus",
    }
    return uid, env


def as_user(uid: int, env: dict[str, str], argv: list[str]) -> list[str]:
    """argv run as the box's ordinary user, with its user manager's environment."""
    return [
        "setpriv", f"--reuid={uid}", f"--regid={uid}", "--init-groups",
        "env", *[f"{k}={v}" for k, v in env.items()], *argv,
    ]  # fmt: skip


def test_user_manager_for_ordinary_users(box_user: tuple[int, dict[str, str]], job: Job) -> None:
    uid, env = box_user
    os.chmod(job.dir, 0o777)
    # From inside the user manager's own tree (a scope of it): no front end needed, the
    # watcher adopts itself (tests/integration/test_frontend.py: from a login shell).
    inside = ["systemd-run", "--user", "--scope", "--quiet"]
    res = job.box.run(
        as_user(uid, env, [*inside, *job.argv("--nproc", "2", script_args=["--print"])]),
        cwd=str(REPO),
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0, res.stderr
    assert (
        "--frontend-child"
        not in job.box.run(
            ["journalctl", f"_SYSTEMD_USER_UNIT=gpulaunch-{job.names.component}-launch.service"],
            capture_output=True,
            text=True,
        ).stdout
    )
    user_slice = f"0::/user.slice/user-{uid}.slice/user@{uid}.service/gpulaunch.slice/"
    assert f"rank 1 cgroup {user_slice}{job.names.job_slice}/{job.names.ranks_slice}/" in res.stdout
    leftover = job.box.run(
        as_user(uid, env, ["systemctl", "--user", "list-units", "--all", "--plain", "gpulaunch-*"]),
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert job.names.job_slice not in leftover
    assert job.alive() == []


def test_ordinary_user_without_a_user_manager(job: Job) -> None:
    """--supervisor systemd: 69 and what to do; auto: the direct supervisor, saying why."""
    os.chmod(job.dir, 0o777)

    def run(*opts: str) -> subprocess.CompletedProcess[str]:
        return job.box.run(
            [
                "setpriv",
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
                "env",
                "-u",
                "DBUS_SESSION_BUS_ADDRESS",
                "XDG_RUNTIME_DIR=/nonexistent",
                "HOME=/nonexistent",
                *job.argv("--nproc", "1", *opts),
            ],
            cwd=str(REPO),
            capture_output=True,
            text=True,
        )

    res = run("--supervisor", "systemd")
    assert res.returncode == 69, res.stderr
    assert "cannot reach your systemd user manager" in res.stderr
    assert "enable-linger" in res.stderr and "Traceback" not in res.stderr
    assert not job.pids()
    res = run()
    assert res.returncode == 0, res.stderr
    assert "direct supervisor" in res.stderr and "enable-linger" in res.stderr, res.stderr
    assert "Traceback" not in res.stderr and "internal error" not in res.stderr
