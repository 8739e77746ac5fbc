"""Hostile and odd input where users are (issue 22 items 7, 8, 15): as root under the
system manager, and as an ordinary user from a login shell (the front end)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from tests.integration.jobs import GPULAUNCH, REPO, Job
from tests.integration.shared import Login, assert_user_clean, login, make_user, ujob

pytestmark = pytest.mark.integration
__all__ = ["login", "ujob"]  # fixtures

ARGV_BYTES = str(REPO / "tests" / "integration" / "scripts" / "argv_bytes.py")
NOT_UTF8 = [os.fsdecode(b"caf\xe9"), os.fsdecode(b"\xed\xa0\x80"), "ok", ""]


def _seen(job: Job, rank: int) -> list[bytes]:
    return bytes.fromhex((job.dir / f"argv{rank}.hex").read_text()).split(b"\0")


def test_script_arguments_that_are_not_utf8_reach_the_ranks_as_root(job: Job) -> None:
    res = job.run("--nproc", "2", script=ARGV_BYTES, script_args=NOT_UTF8, text=False)
    assert res.returncode == 0, res.stderr
    for rank in (0, 1):
        assert _seen(job, rank) == [b"caf\xe9", b"\xed\xa0\x80", b"ok", b""]


def test_script_arguments_that_are_not_utf8_reach_the_ranks_through_the_front_end(
    login: Login, ujob: Job
) -> None:
    # systemd-run (the login session here) takes only UTF-8: the shell in it makes the bytes
    made = 'exec "$@" "$(printf "caf\\351")" "$(printf "\\355\\240\\200")" ok ""'
    argv = ["sh", "-c", made, "sh", *ujob.argv("--nproc", "2", script=ARGV_BYTES)]
    res = login.box.run(login.argv(argv), cwd=str(REPO), capture_output=True, text=False)
    assert res.returncode == 0, res.stderr
    assert b"Future exception" not in res.stderr and b"Traceback" not in res.stderr
    for rank in (0, 1):
        assert _seen(ujob, rank) == [b"caf\xe9", b"\xed\xa0\x80", b"ok", b""]
    assert_user_clean(login, ujob)


def _one_line(res: Any, code: int, text: str) -> None:
    assert res.returncode == code, res.stderr
    assert res.stderr.startswith("gpulaunch: error: ") and res.stderr.count("\n") == 1, res.stderr
    assert text in res.stderr, res.stderr


def test_start_from_a_deleted_working_directory_through_the_front_end(
    login: Login, ujob: Job
) -> None:
    gone = f"/tmp/gl-gone-{ujob.id}"
    res = login.run(
        ["sh", "-c", f'mkdir {gone} && cd {gone} && rmdir {gone} && exec "$@"', "sh",
         *ujob.argv("--nproc", "1")]
    )  # fmt: skip
    _one_line(res, 2, "cannot start in this working directory")
    assert_user_clean(login, ujob)


@pytest.mark.parametrize(
    ("setup", "text"),
    [
        ("mkdir -m 555 {d}", "cannot write to"),
        ("ln -s /tmp {d}", "is a symbolic link"),
        ("touch {d}", "is not a directory"),
    ],
    ids=["read-only", "symlink", "file"],
)
def test_an_unusable_runtime_directory(login: Login, ujob: Job, setup: str, text: str) -> None:
    """$XDG_RUNTIME_DIR/gpulaunch that the user made unusable: one line, 69, nothing made."""
    runtime = f"/tmp/gl-xdg-{ujob.id}"
    d = f"{runtime}/gpulaunch"
    script = f'mkdir -m 700 {runtime} && {setup.format(d=d)} && XDG_RUNTIME_DIR={runtime} "$@"'
    res = login.run(["sh", "-c", script, "sh", *ujob.argv("--nproc", "1")])
    _one_line(res, 69, text)
    assert_user_clean(login, ujob)


def test_a_runtime_directory_of_another_user(box: Any, login: Login, ujob: Job) -> None:
    runtime = Path(f"/tmp/gl-xdg-root-{ujob.id}")
    box.run(["mkdir", "-m", "777", str(runtime)], check=True)
    box.run(["mkdir", "-m", "755", str(runtime / "gpulaunch")], check=True)  # root's
    res = login.run(["env", f"XDG_RUNTIME_DIR={runtime}", *ujob.argv("--nproc", "1")])
    _one_line(res, 69, "not to you")
    assert_user_clean(login, ujob)


def test_doctor_says_what_start_does_for_a_user_without_a_manager(box: Any, ujob: Job) -> None:
    """No systemd answers this user (no user manager, as in CI or a container): `start`
    runs under the direct supervisor, so `doctor` says a job can run (issue 22 item 8)."""
    nolinger = make_user(box, "glnolinger", manager=False)
    res = nolinger.run([GPULAUNCH, "doctor"])
    assert res.returncode == 0, res.stdout + res.stderr
    assert "a job gets" in res.stdout and "direct:" in res.stdout, res.stdout
    assert res.stdout.rstrip().endswith("gpulaunch doctor: a job can run here"), res.stdout
    assert nolinger.run(ujob.argv("--nproc", "1")).returncode == 0
    # And where start cannot run, neither says it can: an error-file directory in the way.
    runtime = f"/tmp/gl-doctor-{ujob.id}"
    bad = f"mkdir -m 700 {runtime} && ln -s /tmp {runtime}/gpulaunch && "
    bad += f'XDG_RUNTIME_DIR={runtime} "$@"'
    res = nolinger.run(["sh", "-c", bad, "sh", GPULAUNCH, "doctor"])
    assert res.returncode == 69 and "a job cannot run here" in res.stdout, res.stdout
    assert "is a symbolic link" in res.stdout, res.stdout
    res = nolinger.run(["env", f"XDG_RUNTIME_DIR={runtime}", *ujob.argv("--nproc", "1")])
    assert res.returncode == 69 and "is a symbolic link" in res.stderr, res.stderr


SPEW = """import os, time
for i in range(400):
    print(f"line {i} of rank {os.environ['RANK']}", flush=True)
    time.sleep(0.005)
"""


@pytest.mark.parametrize("who", ["root", "user"])
def test_a_reader_that_goes_away_is_141(box: Any, login: Login, ujob: Job, who: str) -> None:
    """`gpulaunch start ... 2>&1 | head -1`: the status of a SIGPIPE, as for root (the
    front end said 120: Python's failed flush at exit; issue 22 item 15)."""
    script = ujob.dir / "spew.py"
    script.write_text(SPEW)
    script.chmod(0o644)
    pipe = 'set -o pipefail; "$@" 2>&1 | head -1; exit "${PIPESTATUS[0]}"'
    argv = ["bash", "-c", pipe, "bash", *ujob.argv("--nproc", "2", script=str(script))]
    if who == "root":
        res = box.run(argv, cwd=str(REPO), capture_output=True, text=True, timeout=120)
    else:
        res = login.run(argv)
    assert res.returncode == 141, (res.returncode, res.stdout, res.stderr)
    assert len(res.stdout.splitlines()) == 1 and "Traceback" not in res.stdout + res.stderr
    if who == "user":
        assert_user_clean(login, ujob)
