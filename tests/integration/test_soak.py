"""A short fault soak (bench/soak/, `python -m bench soak`) in the box: 40 seeded jobs,
each with one fault, and not one wrong status, report, record, leftover or hang."""

from __future__ import annotations

import json
import sys

import pytest

from bench.soak.plan import FAULTS, Fault
from tests.integration.jobs import REPO, SHARED

pytestmark = pytest.mark.integration

SEED = 1  # draws every kind below at least twice in 40 jobs (asserted: at least once)
JOBS = 40
# Left out until it is fixed (issue 13, item 13): a SIGINT during start-up after
# gpulaunch/__main__.py put SIGINT's default back, but before the watcher takes the
# interrupts over (start.py's own imports of pystemd, the job API, ...; planning) raises
# KeyboardInterrupt: a traceback and a death by SIGINT instead of a quiet 130. Timing-
# dependent (the 500-job run in bench/results/ missed it); this replay hit it 2 of 3 times:
# python -m bench soak --seed 2 --first 13 --jobs 1 --only slice-stop,late-sigterm,\
# late-sigint,gpulaunch-stop,watcher-sigterm,watcher-sigint
NOT_YET = {Fault.WATCHER_SIGINT}


def test_a_short_fault_soak_finds_nothing(box: object) -> None:
    kinds = [f for f in FAULTS if f not in NOT_YET]
    out = SHARED / "soak"
    argv = [sys.executable, "-m", "bench", "soak", "--jobs", str(JOBS), "--seed", str(SEED)]
    argv += ["--only", ",".join(kinds), "--out", str(out)]
    res = box.run(argv, cwd=str(REPO), capture_output=True, text=True, timeout=1800)  # type: ignore[attr-defined]
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
