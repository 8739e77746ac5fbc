"""A torchrun user's hands at a terminal (issue 35, items 3 and 4), at a real pty.

`scripts/at_terminal.py` runs `gpulaunch start` in a session of its own whose controlling
terminal is a pty, as a shell runs its foreground job, and types on it: a line for
`input()`, a command at pdb's prompt, Ctrl-C as the terminal's interrupt character (the
kernel's SIGINT to the foreground group; no test sends a signal). As root under both
supervisors, and as an ordinary user from a login session (the front end).

Before: the rank, a process group of its own, was stopped by SIGTTIN when it read the
terminal (nothing shown, the job hung); Ctrl-C reached the ranks as SIGTERM, so their
`except KeyboardInterrupt:` never ran.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.integration.jobs import REPO, Job, assert_clean
from tests.integration.shared import Login, assert_user_clean, make_user

pytestmark = pytest.mark.integration

AT_TERMINAL = str(REPO / "tests" / "integration" / "scripts" / "at_terminal.py")
STEP_TIMEOUT = "60"  # seconds an expected text may take to show (a loaded box)

ASK = """
import os
rank = int(os.environ["RANK"])
if rank == 1:
    line = input("name? ")
    print(f"got {line!r}", flush=True)
    x = 6
    breakpoint()
    print("after pdb", flush=True)
else:
    try:
        input()
    except EOFError:
        print(f"rank {rank} read the end of its stdin", flush=True)
"""

SAVE_ON_CTRL_C = """
import os, sys, time
rank = os.environ["RANK"]
try:
    print(f"rank {rank} ready", flush=True)
    time.sleep(300)
except KeyboardInterrupt:
    time.sleep(1)  # a checkpoint being saved: a second signal, or a SIGTERM, cuts it short
    print(f"rank {rank} saved its checkpoint", flush=True)
"""

PDB_SESSION = [
    {"expect": "name? "},
    {"send": "alice\n"},
    {"expect": "got 'alice'"},
    {"expect": "(Pdb) "},
    {"send": "p x * 7\n"},
    {"expect": "42"},
    {"send": "c\n"},
]
CTRL_C = [{"expect": "rank 0 ready"}, {"expect": "rank 1 ready"}, {"send": "\x03"}]


def at_terminal(plan: list[dict[str, str]], argv: list[str]) -> list[str]:
    return [
        "env", f"TTY_TIMEOUT={STEP_TIMEOUT}", "NO_COLOR=1",
        sys.executable, AT_TERMINAL, json.dumps(plan), "--", *argv,
    ]  # fmt: skip


def result(res: Any) -> dict[str, Any]:
    assert res.returncode == 0, res.stderr
    shown: dict[str, Any] = json.loads(res.stdout)
    shown["screen"] = shown["screen"].replace("\r\n", "\n")
    return shown


def script(job: Job, name: str, text: str) -> str:
    path = Path(job.dir, name)
    path.write_text(text)
    path.chmod(0o644)
    return str(path)


def assert_pdb_session(shown: dict[str, Any]) -> None:
    screen = shown["screen"]
    assert shown["failed"] is None and shown["status"] == 0, screen
    assert "rank 1 reads the terminal; the other ranks read /dev/null" in screen, screen
    assert "[0] rank 0 read the end of its stdin" in screen, screen
    assert "[1] got 'alice'" in screen and "[1] 42" in screen, screen
    assert "after pdb" in screen and "succeeded" in screen, screen


def assert_ctrl_c(shown: dict[str, Any]) -> None:
    screen = shown["screen"]
    assert shown["failed"] is None and shown["status"] == 130, screen
    for rank in (0, 1):  # its handler ran to its end: one SIGINT, no SIGTERM
        assert screen.count(f"[{rank}] rank {rank} saved its checkpoint") == 1, screen
    assert "stopped by SIGINT (status 130)" in screen, screen


@pytest.mark.parametrize("supervisor", ["systemd", "direct"])
def test_a_rank_reads_the_terminal_and_pdb_takes_a_command(job: Job, supervisor: str) -> None:
    argv = job.argv(
        "--nproc", "2", "--stdin-rank", "1", "--supervisor", supervisor,
        script=script(job, "ask.py", ASK),
    )  # fmt: skip
    res = job.box.run(at_terminal(PDB_SESSION, argv), capture_output=True, timeout=300)
    assert_pdb_session(result(res))
    assert_clean(job)


@pytest.mark.parametrize("supervisor", ["systemd", "direct"])
def test_ctrl_c_runs_the_ranks_keyboard_interrupt_handlers(job: Job, supervisor: str) -> None:
    argv = job.argv(
        "--nproc", "2", "--supervisor", supervisor, script=script(job, "save.py", SAVE_ON_CTRL_C)
    )
    res = job.box.run(at_terminal(CTRL_C, argv), capture_output=True, timeout=300)
    assert_ctrl_c(result(res))
    entry = job.record()
    assert (entry["GPULAUNCH_CAUSE"], entry["GPULAUNCH_STATUS"]) == ("interrupted", "130")
    assert_clean(job)


@pytest.fixture(scope="module")
def login(box: Any) -> Login:
    return make_user(box, "glterminal", manager=True)


@pytest.fixture
def ujob(job: Job) -> Job:
    os.chmod(job.dir, 0o777)
    return job


def test_a_rank_reads_a_login_shells_terminal(login: Login, ujob: Job) -> None:
    """The front end reads its terminal for the watcher, a service in no session of it."""
    argv = ujob.argv("--nproc", "2", "--stdin-rank", "1", script=script(ujob, "ask.py", ASK))
    assert_pdb_session(result(login.run(at_terminal(PDB_SESSION, argv), timeout=300)))
    assert_user_clean(login, ujob)


def test_ctrl_c_at_a_login_shells_terminal(login: Login, ujob: Job) -> None:
    argv = ujob.argv("--nproc", "2", script=script(ujob, "save.py", SAVE_ON_CTRL_C))
    assert_ctrl_c(result(login.run(at_terminal(CTRL_C, argv), timeout=300)))
    assert_user_clean(login, ujob)


ASK_ONE = """
line = input("name? ")
print(f"got {line!r}", flush=True)
"""


@pytest.mark.parametrize("supervisor", ["systemd", "direct"])
def test_a_job_in_the_background_leaves_the_shell_its_input(job: Job, supervisor: str) -> None:
    """`gpulaunch start ... &` at an interactive shell: the shell reads what is typed while
    the job runs in the background (nothing of the job stops), and after `fg` (which sends
    no SIGCONT to a job that runs) the rank does."""
    argv = job.argv("--nproc", "1", "--supervisor", supervisor, script=script(job, "a.py", ASK_ONE))
    Path(job.dir, "run.sh").write_text(f"exec {' '.join(argv)} 2>/dev/null\n")
    plan = [
        {"expect": "$ "},
        {"send": f"cd {job.dir}; sh run.sh &\r"},  # Enter: a terminal sends CR
        {"expect": "name? "},
        {"send": "echo shell-$((40 + 2))\r"},
        {"expect": "shell-42"},
        {"send": "fg\r"},
        {"expect": "sh run.sh"},
        {"send": "bob\r"},
        {"expect": "got 'bob'"},
        {"expect": "$ "},
        {"send": "exit\r"},
    ]
    shell = ["env", "PS1=$ ", "bash", "--norc", "-i"]
    shown = result(job.box.run(at_terminal(plan, shell), capture_output=True, timeout=300))
    assert shown["failed"] is None, shown["screen"]
    assert "got 'bob'" in shown["screen"] and "Stopped" not in shown["screen"], shown["screen"]
    assert_clean(job)
