"""gpulaunch/debug/: py-spy's output read and shown, the hang detector's decisions."""

from __future__ import annotations

import json
import os
import subprocess
import sysconfig
import venv
from pathlib import Path

import pytest

from gpulaunch.debug.stacks import (
    RankStacks,
    check_denied,
    format_stacks,
    parse_dump,
)
from gpulaunch.errors import AccessDeniedError

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
