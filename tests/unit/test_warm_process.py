"""gpulaunch/warm/process.py with its real warm process (no systemd needed): a rank is a
fork of it, re-parented to us, held at its gate, with its exact status; what may not be
warm starts cold with one line."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpulaunch.base.procs import reap
from gpulaunch.warm.process import WarmProcess

SCRIPT = """
import os, sys
with open(sys.argv[1], "w") as f:
    f.write(f"{os.getppid()} {'torch' in sys.modules} {os.environ['RANK']} {sys.argv[2:]}")
sys.exit(3)
"""


@pytest.fixture
def warm(tmp_path: Path) -> Iterator[tuple[WarmProcess, list[str], dict[str, str], list[str]]]:
    script = tmp_path / "s.py"
    script.write_text(SCRIPT)
    argv = [sys.executable, "-u", str(script), str(tmp_path / "out"), "a b"]
    env = {"PATH": os.environ.get("PATH", ""), "OMP_NUM_THREADS": "1", "RANK": "0"}
    said: list[str] = []
    process = WarmProcess("t", argv, env, ["json"], said.append)
    try:
        assert process.start() is not None
        asyncio.run(process.ready())
        yield process, argv, env, said
    finally:
        process.close()


def test_a_warm_rank_is_our_child_held_at_its_gate(
    warm: tuple[WarmProcess, list[str], dict[str, str], list[str]], tmp_path: Path
) -> None:
    process, argv, env, said = warm
    child = process.spawn(1, argv, {**env, "RANK": "1"}, {0: 0, 1: 1, 2: 2}, 0)
    assert child is not None and said == []
    assert not (tmp_path / "out").exists()  # at its gate: no line of the script ran
    child.release()
    status = reap(child.pidfd)  # waitid(P_PIDFD): only a parent may
    child.close()
    assert status.code == 3 and status.signal is None
    parent, warm_start, rank, args = (tmp_path / "out").read_text().split(" ", 3)
    assert (int(parent), warm_start, rank, args) == (os.getpid(), "True", "1", "['a b']")


def test_a_rank_whose_environment_differs_starts_cold(
    warm: tuple[WarmProcess, list[str], dict[str, str], list[str]],
) -> None:
    process, argv, env, said = warm
    assert process.spawn(0, argv, {**env, "OMP_NUM_THREADS": "4"}, {0: 0, 1: 1, 2: 2}, 0) is None
    assert said == [
        "gpulaunch: rank 0 starts cold: its OMP_NUM_THREADS differs from the warm process's"
    ]


def test_a_program_that_is_not_python_starts_cold() -> None:
    said: list[str] = []
    process = WarmProcess("t", ["./train.sh"], {}, [], said.append)
    assert process.start() is None and process.spawn(0, ["./train.sh"], {}, {}, 0) is None
    assert said == [
        "gpulaunch: warm start off, ranks start cold: its command is not `python -u SCRIPT` "
        "(--no-python)"
    ]
