"""`gpulaunch logs` of a restarted job tells its attempts apart (issue 35): a line between
them, where before the attempts' lines ran together."""

from __future__ import annotations

import pytest

from tests.integration.jobs import GPULAUNCH, Job
from tests.integration.shared import TALK

pytestmark = pytest.mark.integration


def test_logs_marks_where_each_attempt_begins(job: Job) -> None:
    args = ["--lines", "2", "--crash"]
    res = job.run("--nproc", "2", "--max-restarts", "2", script=TALK, script_args=args)
    assert res.returncode != 0, res.stderr
    logs = job.box.run([GPULAUNCH, "logs", job.id], capture_output=True, text=True)
    assert logs.returncode == 0, logs.stderr
    lines = logs.stdout.splitlines()
    marks = [i for i, x in enumerate(lines) if x.startswith("-- attempt")]
    assert [lines[i] for i in marks] == [
        "-- attempt 2 (restart 1) --",
        "-- attempt 3 (restart 2) --",
    ], logs.stdout + res.stderr
    # each attempt's lines, none of another attempt's (a rank stopped by the other's failure
    # before it printed has none in that attempt)
    expected = {f"[{r}] rank {r} line {i}" for r in range(2) for i in range(2)}
    for start, end in zip([-1, *marks], [*marks, len(lines)], strict=True):
        block = lines[start + 1 : end]
        assert block and set(block) <= expected and len(set(block)) == len(block), logs.stdout
    one = job.box.run([GPULAUNCH, "logs", job.id, "--rank", "1"], capture_output=True, text=True)
    # one rank: its lines in the same attempts (none where it was stopped before it printed)
    mine = {n: got for n, got in by_attempt(one.stdout.splitlines()).items() if got}
    whole = {n: [x for x in got if x.startswith("[1] ")] for n, got in by_attempt(lines).items()}
    assert mine == {n: got for n, got in whole.items() if got}, one.stdout
    assert one.stdout.splitlines()[-1].startswith(("[1] ", "-- attempt 3 ")), one.stdout


def by_attempt(lines: list[str]) -> dict[int, list[str]]:
    """Lines by the attempt a marker before them names (1 before any)."""
    out: dict[int, list[str]] = {}
    attempt = 1
    for x in lines:
        if x.startswith("-- attempt "):
            attempt = int(x.split()[2])
            out.setdefault(attempt, [])
        else:
            out.setdefault(attempt, []).append(x)
    return out
