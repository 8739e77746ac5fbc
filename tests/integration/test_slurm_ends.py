"""Slurm's three SIGTERMs told apart under a real Slurm (one box, tests/integration/slurm.py):
`scontrol requeue` (what a requeueing preemption does), `scancel` and the `--time` limit give
three different reports, records and exit codes (gpulaunch/schedulers/slurm.py; issue 38)."""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.jobs import GPULAUNCH, SHARED, wait_until
from tests.integration.slurm import Cluster, slurm_cluster

pytestmark = pytest.mark.integration

CHECKPOINT = str(Path(__file__).parent / "scripts" / "checkpoint.py")
MESSAGE_ID = "74b8d59289c14f16ad639b2abe1d2863"  # gpulaunch/jobapi/record.py


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    with slurm_cluster(1) as c:
        yield c


def _submit(cluster: Cluster, name: str, *sbatch: str, preempt: bool = True) -> tuple[str, Path]:
    jobdir = SHARED / f"{name}-{uuid.uuid4().hex[:6]}"
    jobdir.mkdir(parents=True)
    os.chmod(jobdir, 0o777)
    grace = "--preempt-grace 15 " if preempt else ""
    (jobdir / "job.sbatch").write_text(
        "#!/bin/sh\n"
        f"exec {GPULAUNCH} start --job {jobdir.name} --nproc 1 --grace 1 {grace}"
        f"{CHECKPOINT} --dir {jobdir} --save 0.5\n"
    )
    res = cluster.run(["sbatch", "--parsable", *sbatch, "job.sbatch"], cwd=str(jobdir))
    assert res.returncode == 0, res.stderr
    job_id = res.stdout.strip().split(";")[0]
    wait_until(lambda: (jobdir / "ready0").exists(), 120, "the rank to run")
    return job_id, jobdir


def _output(jobdir: Path) -> str:
    return "".join(p.read_text() for p in jobdir.glob("slurm-*.out"))


def _ended(cluster: Cluster, job_id: str, jobdir: Path, states: tuple[str, ...]) -> str:
    wait_until(lambda: cluster.job_field(job_id, "JobState") in states, 240, f"job {job_id}")
    wait_until(lambda: "gpulaunch: job " in _output(jobdir), 30, "the report")
    return _output(jobdir)


def _journal(cluster: Cluster, job: str) -> list[dict[str, str]]:
    """Every run's journal record of the job, oldest first."""
    res = cluster.run(
        ["journalctl", "-o", "json", "--all", f"MESSAGE_ID={MESSAGE_ID}", f"GPULAUNCH_JOB={job}"]
    )
    return [json.loads(line) for line in res.stdout.splitlines()]


def _record(cluster: Cluster, jobdir: Path) -> dict[str, str]:
    res = cluster.run([GPULAUNCH, "status", "--json", jobdir.name])
    assert res.returncode in (0, 79, 85, 143), res.stderr
    data: dict[str, str] = json.loads(res.stdout)
    return data


def test_scancel_is_a_stop_never_a_requeue(cluster: Cluster) -> None:
    """Even with --preempt-grace, which takes the SIGTERM for a preemption notice: 143."""
    job_id, jobdir = _submit(cluster, "cancel", "--requeue")
    assert cluster.run(["scancel", job_id]).returncode == 0
    out = _ended(cluster, job_id, jobdir, ("CANCELLED",))
    assert f"job {jobdir.name} stopped by scancel (Slurm cancelled the job) (status 143)" in out, (
        out
    )
    assert cluster.job_field(job_id, "Restarts") == "0"
    record = _record(cluster, jobdir)
    assert (record["cause"], record["status"]) == ("interrupted", 143), record
    assert [r["GPULAUNCH_CAUSE"] for r in _journal(cluster, jobdir.name)] == ["interrupted"]


def test_a_requeue_is_a_preemption(cluster: Cluster) -> None:
    """`scontrol requeue` (as a preemption with PreemptMode=REQUEUE): 79, requeue it."""
    job_id, jobdir = _submit(cluster, "requeue", "--requeue", preempt=False)
    assert cluster.run(["scontrol", "requeue", job_id]).returncode == 0
    wait_until(lambda: "preempted" in _output(jobdir), 120, "the first run's report")
    out = _output(jobdir)
    assert f"job {jobdir.name} preempted (status 79: requeue it)" in out, out
    # its own record: the first run's, in the journal (the record file is the last run's);
    # the requeued run (SLURM_RESTART_COUNT=1: the rank exits 0) numbers its attempt on
    wait_until(lambda: cluster.job_field(job_id, "JobState") == "COMPLETED", 180, "run 2")
    records = _journal(cluster, jobdir.name)
    assert [(r["GPULAUNCH_CAUSE"], r["GPULAUNCH_STATUS"]) for r in records] == [
        ("preempted", "79"),
        ("succeeded", "0"),
    ], records
    runs = [json.loads(r["GPULAUNCH_SLURM_RUNS"]) for r in records]
    assert [(r["run"], r["attempts"], r["streak"]) for r in runs] == [(0, 1, 0), (1, 2, 0)]
    assert "run 2 of Slurm job" in _output(jobdir)


def test_the_time_limit_is_its_own_end(cluster: Cluster) -> None:
    """`--time=1`: Slurm's SIGTERM at the limit is "ran out of time", status 85."""
    began = time.monotonic()
    job_id, jobdir = _submit(cluster, "timelimit", "--time=1")
    out = _ended(cluster, job_id, jobdir, ("TIMEOUT",))
    print(f"\nthe time limit's SIGTERM came {time.monotonic() - began:.0f} s after submitting")
    assert (
        f"job {jobdir.name} ran out of time: Slurm's time limit of 00:01:00 (status 85; not a "
        "failure)" in out
    ), out
    record = _record(cluster, jobdir)
    assert (record["cause"], record["status"]) == ("time-limit", 85), record
    assert [r["GPULAUNCH_CAUSE"] for r in _journal(cluster, jobdir.name)] == ["time-limit"]
