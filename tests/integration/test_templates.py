"""Templates as untrusted input, as root in the box next to another user (issue 13, item 9).

The `sudo -E` situation: root runs `gpulaunch render` with HOME pointing at another
user's home, which holds a template that escapes jinja2 to run a command. That command
must not run, and root must say what it refuses.
"""

from __future__ import annotations

import subprocess
import uuid

import pytest

from tests.integration.jobs import GPULAUNCH, RANK_SCRIPT, REPO, Job

pytestmark = pytest.mark.integration

USER = "gltmpl"


@pytest.fixture(scope="module")
def other_home(box: object) -> str:
    """An ordinary user's home directory, inside the box only."""
    from sdbox import Box

    if not isinstance(box, Box):
        pytest.skip("needs the throwaway box: it would add a user to this host")
    if box.run(["id", "-u", USER], capture_output=True).returncode != 0:  # one box a session
        box.run(["useradd", "--create-home", USER], check=True, capture_output=True)
    return f"/home/{USER}"


def exploit(marker: str) -> str:
    """job.slice text whose Description= runs `id -un > marker` if jinja2 lets it."""
    command = f"id -un > {marker}"
    return (
        "[Unit]\n"
        f"Description={{{{ lipsum.__globals__['os'].popen('{command}').read() }}}}\n"
        "[Slice]\n"
    )


def sh(job: Job, script: str, *args: str, user: str | None = None) -> None:
    argv = ["sh", "-ec", script, "sh", *args]
    if user is not None:
        argv = ["runuser", "-u", user, "--", *argv]
    job.box.run(argv, check=True, capture_output=True)


def exists(job: Job, path: str) -> bool:
    return job.box.run(["test", "-e", path]).returncode == 0


def render(job: Job, *opts: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    env_args = [f"{k}={v}" for k, v in env.items()]
    argv = ["env", *env_args, GPULAUNCH, "render", "--job", job.id, *opts, RANK_SCRIPT]
    return job.box.run(argv, cwd=str(REPO), capture_output=True, text=True, timeout=60)


def test_root_does_not_run_another_users_template(other_home: str, job: Job) -> None:
    marker = f"/tmp/pwned-{uuid.uuid4().hex[:8]}"
    units = f"{other_home}/.config/gpulaunch/units"
    sh(job, 'mkdir -p "$1" && printf %s "$2" > "$1/job.slice"', units, exploit(marker), user=USER)

    res = render(job, env={"HOME": other_home})  # sudo -E: root with the user's HOME
    assert res.returncode == 0, res.stderr
    assert not exists(job, marker), "the other user's template ran as root"
    assert f"# {job.names.job_slice} (from {units}/job.slice)" not in res.stdout
    assert f"(from {REPO}/units/job.slice)" in res.stdout  # the built-in one
    res = render(job, env={"HOME": "/root", "XDG_CONFIG_HOME": f"{other_home}/.config"})
    assert res.returncode == 0, res.stderr
    assert not exists(job, marker)

    # Named by root itself, the user's directory is still refused: the user could change it.
    res = render(job, "--units-dir", units, env={"HOME": "/root"})
    assert res.returncode == 78, res.stderr
    assert res.stderr.startswith(f"gpulaunch: error: refusing templates in {units}: ")
    assert f"is owned by {USER}" in res.stderr and res.stderr.count("\n") == 1
    assert not exists(job, marker)


def test_a_sandbox_escape_in_a_units_dir_is_refused(job: Job) -> None:
    marker = f"/tmp/pwned-{uuid.uuid4().hex[:8]}"
    units = f"/var/tmp/gpulaunch-units-{job.id}"
    sh(job, 'mkdir -m 755 "$1" && printf %s "$2" > "$1/job.slice"', units, exploit(marker))
    try:
        res = render(job, "--units-dir", units, env={"HOME": "/root"})
        assert res.returncode == 78, res.stderr
        assert res.stderr.startswith(
            f"gpulaunch: error: {units}/job.slice:2: refused by the sandbox: "
        ), res.stderr
        assert res.stderr.count("\n") == 1 and "Traceback" not in res.stderr
        assert not exists(job, marker), "the template's command ran"
        assert res.stdout == ""
    finally:
        sh(job, 'rm -rf "$1"', units)
