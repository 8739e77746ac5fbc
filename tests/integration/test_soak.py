"""A short fault soak (bench/soak/, `python -m bench soak`) in the box: 40 seeded jobs,
each with one fault, and not one wrong status, report, record, leftover or hang."""

from __future__ import annotations

import json
import os
import sys

import pytest

from bench.machine import IN_BOX
from bench.soak.plan import FAULTS
from tests.integration.jobs import REPO, SHARED

pytestmark = pytest.mark.integration

# Draws every kind at least once in 40 jobs (asserted), restart-sigterm with and without
# --preempt-grace; found by drawing plans alone (bench/soak/plan.py: `draw`), no job run.
SEED = 2465
JOBS = 40
# Every kind runs. The watcher-SIGINT kind, once left out "until fixed" (issue 13, item 13),
# is fixed on main (the quiet ^C from gpulaunch/__main__.py's first line; the judge tells
# Python's own start-up KeyboardInterrupt apart): its old replay (seed 2, job 13) ends 130
# 3 of 3 times and 24 jobs of it alone found nothing. The kinds of issue 22 (the front
# end's, the direct supervisor's, the early outside stop) pass once its items 1-3 are fixed.
# The kinds of issue 35 (restart-sigterm, direct-pkill, direct-stop: items 8, 11, 5) pass
# on main with its fixes; direct-pkill also needed the sentinel to wait for the dying
# watcher to leave its cgroup (gpulaunch/supervisor/sentinel.py).


def test_a_short_fault_soak_finds_nothing(box: object) -> None:
    from sdbox import Box

    if not isinstance(box, Box):
        pytest.skip("needs the throwaway box: the soak adds the front end's user")
    kinds = list(FAULTS)
    out = SHARED / "soak"
    argv = [sys.executable, "-m", "bench", "soak", "--jobs", str(JOBS), "--seed", str(SEED)]
    argv += ["--only", ",".join(kinds), "--out", str(out)]
    env = {**os.environ, IN_BOX: "1"}  # it adds the front end's user: this box is throwaway
    res = box.run(argv, cwd=str(REPO), capture_output=True, text=True, timeout=1800, env=env)
    failed = [line for line in res.stderr.splitlines() if "FAILED" in line or "replay" in line]
    assert res.returncode == 0, "\n".join([res.stdout, *failed, res.stderr[-3000:]])
    (found,) = out.glob("*-soak.json")
    data = json.loads(found.read_text())
    assert len(data["jobs"]) == JOBS
    assert set(data["table"]) == set(kinds)  # every kind ran
    columns = ("wrong_status", "wrong_report", "leaked_units", "leaked_procs", "missing_record")
    for fault, row in data["table"].items():
        assert [row[c] for c in (*columns, "hang")] == [0] * 6, (fault, row)
    assert data["problems"] == []
