"""Forking held children with real forks under low RLIMIT_NOFILE limits.

Each case runs in a fresh Python process whose limits it sets first, so that
pytest's own fds and limits do not matter, and the test process keeps its own.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from gpulaunch.base.procs import WaitStatus, reap
from gpulaunch.watcher.limits import Limits, job_does_not_fit, job_needs

PRELUDE = """
import json, os, resource, sys
from gpulaunch.base import nofile
from gpulaunch.base.procs import reap, spawn_held

def run(argv, fds):
    child = spawn_held(argv, {"PATH": os.environ["PATH"]}, fds)
    child.release()
    status = reap(child.pidfd)
    child.close()
    return status.code
"""


def _python(script: str) -> dict[str, object]:
    res = subprocess.run(
        [sys.executable, "-c", PRELUDE + textwrap.dedent(script)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    result: dict[str, object] = json.loads(res.stdout.splitlines()[-1])
    return result


def test_spawn_with_a_limit_of_64() -> None:
    out = _python("""
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
        r, w = os.pipe()
        code = run(["sh", "-c", "echo hello"], {1: w})
        os.close(w)
        print(json.dumps({"code": code, "out": os.read(r, 100).decode()}))
    """)
    assert out == {"code": 0, "out": "hello\n"}


def test_spawn_with_every_fd_below_the_limit_taken() -> None:
    # The watcher of a big job holds nearly all of its limit: the child must still manage.
    out = _python("""
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
        r, w = os.pipe()
        held = []
        try:
            while True:
                held.append(os.open("/dev/null", os.O_RDONLY))
        except OSError:
            pass
        os.close(held.pop())  # room for the gate pipe's two ends and the pidfd
        os.close(held.pop())
        os.close(held.pop())
        code = run(["sh", "-c", "echo hello >&2"], {2: w})
        os.close(w)
        print(json.dumps({"code": code, "out": os.read(r, 100).decode()}))
    """)
    assert out == {"code": 0, "out": "hello\n"}


def test_targets_that_are_other_sources() -> None:
    # fd 3 must become what was at 4 and fd 4 what was at 3 (a naive dup2 loses one), and
    # fd 5 stays what it was.
    out = _python("""
        import fcntl
        resource.setrlimit(resource.RLIMIT_NOFILE, (32, 32))

        def high(fd):
            new = fcntl.fcntl(fd, fcntl.F_DUPFD, 10)
            os.close(fd)
            return new

        pipes = [[high(fd) for fd in os.pipe()] for _ in range(3)]
        for (_, w), at in zip(pipes, (4, 3, 5)):
            os.dup2(w, at)
            os.close(w)
        code = run(["sh", "-c", "echo one >&3; echo two >&4; echo three >&5"], {3: 4, 4: 3, 5: 5})
        for fd in (3, 4, 5):
            os.close(fd)
        print(json.dumps([code, *(os.read(r, 100).decode() for r, _ in pipes)]))
    """)
    assert out == [0, "one\n", "two\n", "three\n"]


def test_children_get_the_users_soft_limit_back() -> None:
    out = _python("""
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, 4096))
        nofile.raise_nofile(1000)
        raised = resource.getrlimit(resource.RLIMIT_NOFILE)
        r, w = os.pipe()
        code = run(["sh", "-c", "ulimit -Sn; ulimit -Hn"], {1: w})
        os.close(w)
        child = os.read(r, 100).decode().split()
        print(json.dumps({"code": code, "raised": raised, "child": child}))
    """)
    assert out["code"] == 0
    assert out["raised"] == [4096, 4096]
    assert out["child"] == ["256", "4096"]


def test_a_child_that_cannot_start_says_why() -> None:
    out = _python("""
        r, w = os.pipe()
        os.dup2(w, 2)
        code = run(["true"], {1: 987})  # not an open fd
        os.close(w)
        os.close(2)
        print(json.dumps({"code": code, "err": os.read(r, 1000).decode()}))
    """)
    assert out["code"] == 127
    lines = str(out["err"]).splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpulaunch: child ")
    assert "cannot start: [Errno 9] Bad file descriptor" in lines[0]


def test_a_program_that_cannot_be_executed_says_why() -> None:
    out = _python("""
        r, w = os.pipe()
        code = run(["/nonexistent/program"], {2: w})
        os.close(w)
        print(json.dumps({"code": code, "err": os.read(r, 1000).decode()}))
    """)
    assert out == {
        "code": 127,
        "err": "gpulaunch: cannot execute /nonexistent/program: No such file or directory\n",
    }


def test_raise_nofile_leaves_enough_alone() -> None:
    out = _python("""
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, 4096))
        nofile.raise_nofile(200)
        print(json.dumps(resource.getrlimit(resource.RLIMIT_NOFILE)))
    """)
    assert out == [256, 4096]


LIMITS = Limits(nofile_hard=1024, nproc_soft=None, pid_max=None, threads_max=None, tasks_now=0)


@pytest.mark.parametrize(
    ("nproc", "limits", "words"),
    [
        (8, LIMITS, None),
        (160, LIMITS, None),
        (200, LIMITS, "hard limit on open files (1024, see 'ulimit -Hn')"),
        (8, Limits(1 << 20, 15, None, None, 0), "limit on processes (15, see 'ulimit -u')"),
        (8, Limits(1 << 20, 18, None, None, 0), None),
        (8, Limits(1 << 20, None, 100, 10**6, 90), "kernel.pid_max (100, 90 in use)"),
        (8, Limits(1 << 20, None, 10**6, 100, 90), "kernel.threads-max (100, 90 in use)"),
        (8, Limits(-1, None, None, None, 0), None),  # RLIM_INFINITY
    ],
)
def test_job_fits(nproc: int, limits: Limits, words: str | None) -> None:
    error = job_does_not_fit(nproc, job_needs(nproc), limits)
    if words is None:
        assert error is None
    else:
        assert error is not None and words in error.message
        assert error.exit_code == 2 and error.hint and "fewer ranks" in error.hint


def test_job_needs() -> None:
    assert job_needs(10).fds == 64 + 10 * 6
    assert job_needs(10, log_dir=True).fds == 64 + 10 * 7
    assert job_needs(10).processes == 22


def test_a_stop_in_the_first_instants_of_a_held_child_finds_its_own_dispositions() -> None:
    """A SIGTERM right after the fork (a rank that failed at once, then the gang stop)
    reaches a pump that ignores it as ignored, never as death (its rank's last lines were
    lost: 1 unit-test run in 10 on a loaded machine), and a rank as death, never as the
    watcher's own handler run in the child (a phantom interrupt through the wakeup fd)."""
    import os
    import signal

    from gpulaunch.base.procs import fork_held

    def held(ignore: tuple[signal.Signals, ...]) -> WaitStatus:
        child = fork_held(lambda: os._exit(0), {}, ignore=ignore)
        os.kill(child.pid, signal.SIGTERM)  # mostly before the child ran a line of its own
        child.release()
        status = reap(child.pidfd)
        child.close()
        return status

    previous = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        pumps = [held((signal.SIGTERM,)) for _ in range(40)]
        signal.signal(signal.SIGTERM, lambda signum, frame: None)  # the watcher's handler
        ranks = [held(()) for _ in range(40)]
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert [s for s in pumps if s.signal is not None] == []
    assert [s for s in ranks if s.signal != signal.SIGTERM] == []
