"""gpulaunch/debug/: py-spy's output read and shown, the hang detector's decisions."""

from __future__ import annotations

import json
import os
import subprocess
import sysconfig
import venv
from pathlib import Path

import pytest

from gpulaunch.debug.hang import HangClock, collective_of, cpu_seconds, hang_summary
from gpulaunch.debug.stacks import (
    Frame,
    RankStacks,
    Thread,
    check_denied,
    format_stacks,
    parse_dump,
)
from gpulaunch.errors import AccessDeniedError
from gpulaunch.model import Cause, Outcome, RankExit, job_outcome

ROOT = Path(__file__).resolve().parents[2]


def frame(name: str, filename: str, line: int) -> dict[str, object]:
    return {
        "name": name,
        "filename": filename,
        "module": None,
        "short_filename": os.path.basename(filename),
        "line": line,
        "locals": None,
        "is_entry": False,
        "is_shim_entry": False,
    }


DUMP = json.dumps(
    [
        {
            "pid": 71,
            "thread_id": 1,
            "thread_name": "Thread-1 (worker)",
            "os_thread_id": 73,
            "active": False,
            "owns_gil": False,
            "frames": [frame("worker", "/x/train.py", 3), frame("Thread.run", "/t.py", 982)],
        },
        {
            "pid": 71,
            "thread_id": 2,
            "thread_name": "MainThread",
            "os_thread_id": 71,
            "active": True,
            "owns_gil": True,
            "frames": [frame("main", "/x/train.py", 6), frame("<module>", "/x/train.py", 7)],
        },
    ]
)


def test_a_dump_becomes_threads_and_the_main_thread_is_the_pids() -> None:
    stacks = RankStacks(2, "u.scope", 71, threads=parse_dump(DUMP))
    main = stacks.main_thread()
    assert main is not None and main.name == "MainThread"
    assert [f.describe() for f in main.frames] == ["main (train.py:6)", "<module> (train.py:7)"]
    text = format_stacks(stacks)
    assert text.splitlines()[0] == "rank 2 (u.scope, pid 71):"
    assert '  thread 71 (active): "MainThread"' in text
    assert "    worker (train.py:3)" in text
    cut = format_stacks(stacks, limit=1)
    assert "Thread.run" not in cut and "[... 1 outer frames cut ...]" in cut


def test_a_rank_without_stacks_says_why() -> None:
    text = format_stacks(RankStacks(1, "u.scope", 9, error="process 9 is gone"))
    assert text == "rank 1 (u.scope, pid 9): no stacks: process 9 is gone"


def test_ptrace_refused_for_every_rank_is_one_error() -> None:
    denied = [RankStacks(r, "u", r + 10, error="Permission denied", denied=True) for r in (0, 1)]
    with pytest.raises(AccessDeniedError) as info:
        check_denied(denied)
    assert "ptrace" in info.value.message
    check_denied(denied[:1] + [RankStacks(1, "u", 11, threads=())])  # one rank: shown per rank


def test_without_py_spy_stacks_is_one_line(tmp_path: Path) -> None:
    """A Python without py-spy beside it or on PATH: exit 69 and the extra to install."""
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=False, symlinks=True)
    site = sysconfig.get_paths()["purelib"]
    env = {
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": os.pathsep.join([str(ROOT), site]),
        "HOME": str(tmp_path),
    }
    res = subprocess.run(
        [str(env_dir / "bin" / "python"), "-m", "gpulaunch", "stacks", "somejob"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert res.returncode == 69, res.stderr
    assert res.stderr.splitlines() == [
        "gpulaunch: error: py-spy is not installed, and gpulaunch needs it for stacks; "
        "install it with pip install 'gpulaunch[debug]' (or pip install py-spy)"
    ]


# -- the hang detector (debug/hang.py) ------------------------------------------


def test_quiet_ranks_are_hung_after_the_timeout_and_not_before() -> None:
    clock = HangClock(timeout=4.0, started=0.0)
    assert clock.check(2.0, last_output=0.0, cpu={0: 1.0, 1: 1.0}) == 4.0
    assert clock.check(4.0, last_output=0.0, cpu={0: 1.0, 1: 1.0}) is None


def test_output_or_cpu_moves_the_deadline() -> None:
    clock = HangClock(timeout=4.0, started=0.0)
    assert clock.check(2.0, last_output=1.5, cpu={0: 1.0}) == 4.0  # at most half a timeout on
    assert clock.check(4.0, last_output=1.5, cpu={0: 1.0}) == 5.5
    # rank 0 used 0.5 s of CPU in 1.5 s: alive; checks go on every half timeout
    assert clock.check(5.5, last_output=1.5, cpu={0: 1.5}) == 7.5
    assert clock.check(7.5, last_output=1.5, cpu={0: 1.5}) == 9.5
    assert clock.check(9.5, last_output=1.5, cpu={0: 1.5}) is None  # 4 s quiet since 5.5
    # a trickle under 1 % of a CPU is not a sign of life
    idle = HangClock(timeout=4.0, started=0.0)
    idle.check(2.0, 0.0, {0: 1.0})
    assert idle.check(4.0, 0.0, {0: 1.01}) is None


def test_the_cpu_of_a_process_is_read() -> None:
    assert (cpu_seconds(os.getpid()) or 0) > 0
    assert cpu_seconds(2**22 + 12345) is None


def stacks_in(rank: int, *frames: tuple[str, str]) -> RankStacks:
    thread = Thread(
        tid=100 + rank,
        name="MainThread",
        active=False,
        frames=tuple(Frame(n, f, os.path.basename(f), 7) for n, f in frames),
    )
    return RankStacks(rank, f"r{rank}.scope", 100 + rank, threads=(thread,))


C10D = "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py"
LOGGER = "/venv/lib/python3.11/site-packages/torch/distributed/c10d_logger.py"


def test_the_summary_names_who_waits_in_which_collective_and_who_does_not() -> None:
    waiting = [
        stacks_in(r, ("all_reduce", C10D), ("wrapper", LOGGER), ("main", "/x/train.py"))
        for r in (0, 2, 3)
    ]
    away = stacks_in(1, ("sleep", "/usr/lib/python3.11/time.py"), ("elsewhere", "/x/train.py"))
    assert collective_of(waiting[0]) == "all_reduce" and collective_of(away) is None
    summary = hang_summary([waiting[0], away, *waiting[1:]])
    assert summary == (
        "ranks 0, 2, 3 in all_reduce called from main (train.py:7); "
        "rank 1 not in a collective: elsewhere (train.py:7)"
    )
    gone = RankStacks(4, "r4.scope", 9, error="gone")
    assert hang_summary([gone]) == "rank 4: no stacks (gone)"


def test_ranks_in_the_same_collective_from_different_calls_are_told_apart() -> None:
    """A mismatch: rank 1 waits in a barrier the others passed, they in the next one."""

    def at(rank: int, caller: str) -> RankStacks:
        frames = (("barrier", C10D), ("wrapper", LOGGER), (caller, "/x/train.py"))
        return stacks_in(rank, *frames)

    summary = hang_summary([at(0, "step"), at(1, "warmup"), at(2, "step")])
    assert summary == (
        "ranks 0, 2 in barrier called from step (train.py:7); "
        "rank 1 in barrier called from warmup (train.py:7)"
    )


def test_a_hang_is_the_cause_unless_a_failure_or_interrupt_came_first() -> None:
    stopped = RankExit(None, 15, stopped_by_watcher=True, observed_at=6.0, runtime=6.0)
    failed = RankExit(3, None, stopped_by_watcher=False, observed_at=4.0, runtime=4.0)
    assert job_outcome({0: stopped}, hung_at=5.0) == Outcome(124, Cause.HUNG, None)
    assert job_outcome({0: stopped, 1: failed}, hung_at=5.0).cause is Cause.RANK_FAILED
    assert job_outcome({0: stopped}, (4.0, 15), hung_at=5.0).cause is Cause.INTERRUPTED
    assert job_outcome({0: stopped}, (6.0, 15), hung_at=5.0).cause is Cause.HUNG
