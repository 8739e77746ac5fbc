"""Root sees and stops an ordinary user's job (issue 22, item 17): `--user-of USER` reaches
their session bus and their records; without it, the error names the option."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.integration.jobs import REPO, Job, wait_until
from tests.integration.shared import box_user, gl, one_line_error

__all__ = ["box_user"]  # a fixture (shared.py)
pytestmark = pytest.mark.integration


def test_root_sees_stops_and_waits_for_a_users_job(
    box_user: tuple[int, list[str]], job: Job
) -> None:
    uid, as_user = box_user
    os.chmod(job.dir, 0o777)
    res = gl(
        job,
        *("start", "-d", "--job", job.id, "--nproc", "2"),
        *("tests/integration/scripts/rank.py", "--dir", str(job.dir), "--sleep", "300"),
        prefix=as_user,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    for rank in range(2):
        job.wait_file(f"rank{rank}.ready")

    # Root without the option: one line that says how to reach it.
    listed = gl(job, "list")
    assert "gljob runs jobs too: gpulaunch list --user-of gljob" in listed.stderr, listed
    one_line_error(gl(job, "status", job.id), 3, "it is a user's job: add --user-of gljob")
    one_line_error(gl(job, "stop", job.id), 3, "--user-of gljob")

    status = gl(job, "status", "--user-of", "gljob", "--json", job.id)
    assert status.returncode == 0, status.stderr
    view = json.loads(status.stdout)
    assert (view["manager"], view["owner"], view["state"]) == ("user", uid, "running")
    listed = gl(job, "list", "--user-of", str(uid), "--json")  # a uid does too
    assert listed.returncode == 0, listed.stderr
    assert [v["job"] for v in json.loads(listed.stdout)] == [job.id]

    stop = gl(job, "stop", "--user-of", "gljob", job.id, timeout=60)
    assert stop.returncode == 0, stop.stderr
    assert "stopped by SIGTERM (status 143)" in stop.stderr, stop.stderr
    wait_until(lambda: not job.alive(), 10, "the ranks to be gone")

    # After the end: the user's record, read by root.
    wait = gl(job, "wait", "--user-of", "gljob", job.id, timeout=60)
    assert wait.returncode == 143, wait.stderr
    final = json.loads(gl(job, "status", "--user-of", "gljob", "--json", job.id).stdout)
    assert (final["state"], final["status"], final["owner"]) == ("stopped", 143, uid)
    ended = gl(job, "list", "--all", "--user-of", "gljob", "--json")
    assert job.id in [v["job"] for v in json.loads(ended.stdout)], ended.stdout
    one_line_error(gl(job, "wait", job.id), 3, "it is a user's job: add --user-of gljob")


def test_user_of_is_for_root_and_for_users_that_exist(
    box_user: tuple[int, list[str]], job: Job
) -> None:
    _, as_user = box_user
    one_line_error(
        gl(job, "status", "--user-of", "root", "x", prefix=as_user), 2, "--user-of is for root"
    )
    one_line_error(gl(job, "status", "--user-of", "nosuchuser", "x"), 2, "no user 'nosuchuser'")
    one_line_error(gl(job, "status", "--user-of", "root", "x"), 2, "root's jobs are on the system")
    one_line_error(gl(job, "stop", "--user-of", "gljob", "--system", "x"), 2, "not allowed with")
    # A user without a running manager: the bus is not there; nothing of theirs, exit 3 or 69.
    gone = gl(job, "stop", "--user-of", "nobody", "nosuchjob")
    one_line_error(gone, 69, "nobody's session bus", "user manager is not running")


FORGER = """
import asyncio, sys
from dbus_fast import Variant
from dbus_fast.aio import MessageBus
from dbus_fast.service import PropertyAccess, ServiceInterface, dbus_property
from gpulaunch.jobapi.view import INTERFACE, bus_name, object_path

class Forged(ServiceInterface):
    def __init__(self):
        super().__init__(INTERFACE)

    @dbus_property(access=PropertyAccess.READ)
    def Id(self) -> "s":
        return sys.argv[1]

async def main():
    bus = await MessageBus().connect()
    bus.export(object_path(sys.argv[1]), Forged())
    await bus.request_name(bus_name(sys.argv[1]))
    print("ready", flush=True)
    done = asyncio.get_running_loop().create_future()  # until its stdin closes
    asyncio.get_running_loop().add_reader(0, lambda: done.done() or done.set_result(None))
    await done

asyncio.run(main())
"""


def test_a_forged_job_on_a_users_bus_is_one_line_for_root(
    box_user: tuple[int, list[str]], job: Job
) -> None:
    """Issue 35: a program of the user's own that takes a job's name on their session bus
    and answers with what is not a job crashed root's status/stop/top --user-of with
    internal error 70 (KeyError: 'Ranks'). Its answer is untrusted input: one line, "not a
    gpulaunch job", and `list`/`top` simply do not show it."""
    _, as_user = box_user
    forger = job.box.popen(
        [*as_user, sys.executable, "-c", FORGER, job.id],
        cwd=str(REPO),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert forger.stdout is not None and forger.stdout.readline() == "ready\n", forger
        for verb in ("status", "stop"):
            res = gl(job, verb, "--user-of", "gljob", job.id, timeout=60)
            one_line_error(res, 71, "is not a gpulaunch job", "gljob's session bus")
        listed = gl(job, "list", "--user-of", "gljob", "--json", timeout=60)
        assert listed.returncode == 0 and json.loads(listed.stdout) == [], listed.stderr
        top = gl(job, "top", "--user-of", "gljob", "--once", timeout=60)
        assert top.returncode == 0 and "Traceback" not in top.stderr, top.stderr
        assert job.id not in top.stdout, top.stdout
    finally:
        forger.communicate(input="", timeout=30)  # its stdin closed: it ends
