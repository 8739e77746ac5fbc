"""An SSH user whose user manager runs but who has no user bus (issue 29).

A minimal server (no `dbus-user-session`) starts `user@UID.service` for an SSH
login but no bus: `systemctl --user` reaches the manager on its private socket
only. Reproduced in the box by masking the user's `dbus.socket` and stopping
it, which leaves the socket file behind (`RemoveOnStop=` is off): a bus path
that exists and refuses connections, the harder of the two cases. The login
shell is a session scope of root's, as in test_frontend.py: the front end runs,
over the private socket, and its death tie is a service (units/tie.service).
"""

from __future__ import annotations

import os
import stat
import uuid
from typing import Any

import pytest

from tests.integration.container import container
from tests.integration.jobs import GPULAUNCH, REPO, SHARED, Job, wait_until
from tests.integration.shared import PGROUP_LINE, Login, assert_user_clean, gpulaunch, make_user

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def nobus(box: Any) -> Login:
    login = make_user(box, "glnobus", manager=True)
    runtime = f"/run/user/{login.uid}"
    box.run(
        ["runuser", "-u", login.user, "--", "env", f"XDG_RUNTIME_DIR={runtime}",
         "systemctl", "--user", "mask", "--now", "dbus.socket", "dbus.service"],
        check=True, capture_output=True,
    )  # fmt: skip
    # the stopped socket's file stays: it exists and refuses connections
    mode = box.run(["stat", "-c", "%f", f"{runtime}/bus"], capture_output=True, text=True)
    assert mode.returncode == 0 and stat.S_ISSOCK(int(mode.stdout, 16)), mode
    return login


@pytest.fixture
def ujob(job: Job) -> Job:
    os.chmod(job.dir, 0o777)
    return job


def test_a_job_under_the_user_manager_without_a_user_bus(nobus: Login, ujob: Job) -> None:
    res = nobus.run(ujob.argv("--nproc", "2", script_args=["--print"]))
    assert res.returncode == 0, res.stderr
    where = f"0::/user.slice/user-{nobus.uid}.slice/user@{nobus.uid}.service/gpulaunch.slice/"
    for rank in range(2):
        assert f"rank {rank} cgroup {where}{ujob.names.job_slice}/{ujob.names.ranks_slice}/" in (
            res.stdout
        ), res.stdout
    assert "systemd supervisor" in res.stderr and "direct supervisor" not in res.stderr
    line = next(x for x in res.stderr.splitlines() if "no user bus" in x)
    assert f"/run/user/{nobus.uid}/bus refuses connections" in line, line
    assert "dbus-user-session" in line, line
    assert "Traceback" not in res.stderr
    assert_user_clean(nobus, ujob)


def test_a_failing_rank_without_a_user_bus(nobus: Login, ujob: Job) -> None:
    res = nobus.run(
        ujob.argv(
            "--nproc", "3", script_args=["--sleep", "60", "--exit", "1:7", "--fail-after", "0.3"]
        )
    )
    assert res.returncode == 7, res.stderr
    assert "failed: rank 1 exit 7" in res.stderr
    assert_user_clean(nobus, ujob)


def test_front_end_killed_without_a_user_bus(nobus: Login, ujob: Job) -> None:
    """No bus name to lose: the tie service sees the front end's pidfd and stops the job."""
    proc = nobus.popen(ujob.argv("--nproc", "2", script_args=["--sleep", "300", "--print"]))
    try:
        for rank in range(2):
            ujob.wait_file(f"rank{rank}.ready")
        pid = nobus.frontend_pid(ujob)
        nobus.box.run(["kill", "-KILL", str(pid)], check=True)
        took = wait_until(lambda: not ujob.alive(), 30, "every rank process to be gone")
        print(f"all rank processes gone {took:.3f}s after SIGKILL of the front end")
    finally:
        proc.kill()
        proc.communicate()
    assert_user_clean(nobus, ujob)
    # the watcher was stopped as on a SIGTERM, and said so in its record
    status = nobus.run([GPULAUNCH, "status", ujob.id])
    assert "143" in status.stdout + status.stderr, status


def test_supervisor_systemd_needs_no_user_bus(nobus: Login, ujob: Job) -> None:
    res = nobus.run(ujob.argv("--nproc", "1", "--supervisor", "systemd"))
    assert res.returncode == 0, res.stderr
    assert "no user bus" in res.stderr
    assert_user_clean(nobus, ujob)


def test_process_groups_report_each_ranks_own_figures() -> None:
    """The direct supervisor with process groups (a container's read-only cgroup2, as
    Docker mounts it): the ranks share the watcher's cgroup, so no figure of it is a rank's;
    each rank's CPU and peak memory come from wait4 (the report) or psutil (status
    --resources), and no unit is named (none exists)."""
    out = SHARED / f"nobus-{uuid.uuid4().hex[:8]}"
    (out / "state").mkdir(parents=True)
    script = str(REPO / "tests" / "integration" / "scripts" / "usage_rank.py")

    def start(job: str, seconds: str) -> str:
        return gpulaunch(
            out, "start", "--nproc", "2", "--job", job, script, "--dir", str(out),
            "--hold-rank", "1", "--hold-mb", "200", "--seconds", seconds,
        )  # fmt: skip

    look = gpulaunch(out, "status", "live", "--resources")
    ready = f"while [ ! -e {out}/rank0.ready ] || [ ! -e {out}/rank1.ready ]; do sleep 0.1; done"
    with container(read_only=True) as ct:
        live = ct.run(f"{start('live', '3')} >{out}/live.txt 2>&1 & {ready}; {look} 2>&1; wait")
        res = ct.run(f"{start('own', '0.5')} 2>&1")
    # while it runs: the shared cgroup's memory.current is no rank's; their own processes' are
    assert "memory.current: not available here: the ranks share the watcher's cgroup" in (
        live.stdout
    ), live.stdout
    assert res.returncode == 0, res.stdout
    assert PGROUP_LINE in res.stdout, res.stdout
    rows = {
        line.split()[0]: line.split()
        for line in res.stdout.splitlines()
        if line.split()[:1] in (["0"], ["1"]) and "exit" in line
    }
    assert rows["0"][1] == "-" and rows["1"][1] == "-", res.stdout  # no unit names
    assert "gpulaunch-own-rank" not in res.stdout, res.stdout
    assert "the unit's cgroup" not in res.stdout, res.stdout
    assert "cpu: from wait4" in res.stdout and "peak mem: from wait4" in res.stdout, res.stdout
    peak = {rank: float(row[-2]) for rank, row in rows.items() if row[-1] == "MiB"}
    assert peak["1"] >= 200 and peak["0"] < 100, res.stdout  # each its own, not the session's


def test_doctor_says_there_is_no_user_bus(nobus: Login) -> None:
    res = nobus.run([GPULAUNCH, "doctor"])
    assert res.returncode == 0, res.stdout + res.stderr  # a job runs here
    row = next(line for line in res.stdout.splitlines() if "user bus" in line)
    assert "warn" in row and "refuses connections" in row and "systemd/private" in row, row
    assert "dbus-user-session" in res.stdout
    manager = next(line for line in res.stdout.splitlines() if "user manager (default)" in line)
    assert "reachable" in manager, res.stdout
    assert "systemd: the user manager answers" in res.stdout, res.stdout


def test_status_wait_and_stop_without_a_user_bus(nobus: Login, ujob: Job) -> None:
    """The job API's tools read the record file (no bus to publish the job on)."""
    proc = nobus.popen(ujob.argv("--nproc", "2", script_args=["--sleep", "300"]))
    try:
        for rank in range(2):
            ujob.wait_file(f"rank{rank}.ready")
        status = nobus.run([GPULAUNCH, "status", ujob.id])
        assert status.returncode == 0 and f"job {ujob.id}: running" in status.stdout, status
        assert ujob.names.rank_scope(1) in status.stdout, status.stdout  # its units exist
        stop = nobus.run([GPULAUNCH, "stop", ujob.id])
        assert stop.returncode == 0, stop.stderr
        assert f"job {ujob.id} stopped by SIGTERM (status 143)" in stop.stderr, stop.stderr
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 143, err
        waited = nobus.run([GPULAUNCH, "wait", ujob.id])
        assert waited.returncode == 143, waited.stderr
    finally:
        proc.kill()
        proc.communicate()
    assert_user_clean(nobus, ujob)


def test_interrupt_and_detach_without_a_user_bus(nobus: Login, ujob: Job) -> None:
    """Ctrl-C reaches the watcher through the manager's private socket (KillUnit); a detached
    job outlives its front end and `wait` reads its record file."""
    proc = nobus.popen(ujob.argv("--nproc", "2", script_args=["--sleep", "300"]))
    for rank in range(2):
        ujob.wait_file(f"rank{rank}.ready")
    nobus.box.run(["kill", "-INT", str(nobus.frontend_pid(ujob))], check=True)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "stopped by SIGINT (status 130)" in err, err
    assert_user_clean(nobus, ujob)
    detached = Job(ujob.box, ujob.id + "-d", ujob.dir)
    res = nobus.run(detached.argv("--nproc", "2", "--detach", script_args=["--sleep", "1"]))
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == detached.id
    waited = nobus.run([GPULAUNCH, "wait", detached.id])
    assert waited.returncode == 0, waited.stderr
    assert_user_clean(nobus, detached)


def test_user_manager_reexec_under_a_job_without_a_user_bus(nobus: Login, ujob: Job) -> None:
    """daemon-reexec closes every connection to the manager: the job goes on (no bus name
    was lost), the watcher reconnects, and the front end follows the watcher to its end."""
    proc = nobus.popen(ujob.argv("--nproc", "2", script_args=["--sleep", "4"]))
    for rank in range(2):
        ujob.wait_file(f"rank{rank}.ready")
    reexec = nobus.run(["systemctl", "--user", "daemon-reexec"])
    assert reexec.returncode == 0, reexec.stderr
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert "closed our connection" in err and "ended with status 0" in err, err
    assert_user_clean(nobus, ujob)
