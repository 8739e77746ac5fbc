"""examples/slurm/train.sbatch checked without a cluster: bash parses it, its `#SBATCH` lines
ask for what gpulaunch's exits need, its gpulaunch command line goes through gpulaunch's own
parser (in a Slurm job's environment), and it requeues on exactly the statuses that ask for
it. tests/integration/test_slurm_requeues.py runs it under a real Slurm."""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

import pytest

from gpulaunch.cli import build_parser
from gpulaunch.model import CRASH_LOOP_STATUS, PREEMPTED_STATUS, REQUEUE_STATUS
from gpulaunch.options import start_options

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "slurm" / "train.sbatch"
README = EXAMPLE.with_name("README.md")


def _sbatch(text: str) -> list[str]:
    return [line.split()[1] for line in text.splitlines() if line.startswith("#SBATCH ")]


def _command(text: str) -> list[str]:
    lines = [line for line in text.splitlines() if line.startswith("srun gpulaunch start ")]
    assert len(lines) == 1, lines
    return shlex.split(lines[0])[1:]


def test_bash_parses_it() -> None:
    subprocess.run(["bash", "-n", str(EXAMPLE)], check=True)


def test_its_gpulaunch_command_line_parses(monkeypatch: pytest.MonkeyPatch) -> None:
    text = EXAMPLE.read_text()
    monkeypatch.setenv("SLURM_JOB_ID", "42")  # --max-requeues is for a Slurm job
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    words = _command(text)
    assert words[:2] == ["gpulaunch", "start"]
    args = build_parser().parse_args(words[1:])
    opts = start_options(args)
    assert opts.script == "train.py"
    assert opts.max_restarts == 3
    requeue = opts.recovery.requeue
    assert (requeue.max_requeues, requeue.slurm_job, requeue.run) == (5, "42", 1)
    grace = opts.recovery.preempt.grace
    notice = next(o for o in _sbatch(text) if o.startswith("--signal="))
    # to the steps' tasks (gpulaunch), not B: (the batch shell): srun ends its step on a
    # SIGTERM of its own (test_slurm_requeues.py saw "srun: forcing job termination")
    match = re.fullmatch(r"--signal=TERM@(\d+)", notice)
    assert match is not None and grace is not None
    assert grace < int(match.group(1))  # the ranks save before Slurm's own end comes
    assert "--requeue" in _sbatch(text)


def test_it_requeues_on_79_and_81_only() -> None:
    text = EXAMPLE.read_text()
    case = re.search(r"^case \$status in\n([^)]*)\)", text, re.MULTILINE)
    assert case is not None
    codes = {int(c) for c in case.group(1).split("|")}
    assert codes == {PREEMPTED_STATUS, REQUEUE_STATUS}
    assert CRASH_LOOP_STATUS not in codes
    readme = README.read_text()
    for status in (PREEMPTED_STATUS, REQUEUE_STATUS, CRASH_LOOP_STATUS, 85, 143):
        assert f"\n| {status} |" in readme, status
