"""A short fault soak (bench/soak/, `python -m bench soak`) in the box: 40 seeded jobs,
each with one fault, and not one wrong status, report, record, leftover or hang."""

from __future__ import annotations

import json
import sys

from bench.soak.plan import FAULTS, Fault
from tests.integration.jobs import REPO, SHARED

SEED = 1  # draws every kind below at least once in 40 jobs (asserted)
JOBS = 40
# Left out until branch h/ends is merged (issue 13, item 5): an outside `systemctl stop`
# of the job slice is reported as `failed: rank 0 SIGTERM`, cause rank-failed, not as an
# interrupt. Item 6: a SIGTERM/SIGINT that lands as the watcher reports a rank's failure
# kills it after the report (exit -15 while report and record say the rank's status).
# Replay on main: python -m bench soak --seed 2 --first 0 --jobs 1 --only slice-stop
NOT_YET = {Fault.SLICE_STOP, Fault.LATE_SIGTERM, Fault.LATE_SIGINT}


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
