"""The two-level budget across Slurm's requeues, under a real Slurm (one box,
tests/integration/slurm.py; issue 38): `--max-restarts` inside a run, then 81 ("requeue
me") while `--max-requeues` allows, the attempts numbered on across the runs, and a crash
loop across runs ending the job (80).

Each job is examples/slurm/train.sbatch itself, its gpulaunch command line swapped for the
test's: srun returns gpulaunch's status, and the script requeues the job on 79 and 81
(`scontrol requeue`; the box's slurm.conf has `RequeueExit=79` only, so that a requeue on
81 is the script's).
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.jobs import GPULAUNCH, REPO, SHARED, wait_until
from tests.integration.slurm import Cluster, slurm_cluster

pytestmark = pytest.mark.integration

FAILING = str(Path(__file__).parent / "scripts" / "failing_run.py")
CHECKPOINT = str(Path(__file__).parent / "scripts" / "checkpoint.py")
EXAMPLE = REPO / "examples" / "slurm" / "train.sbatch"
MESSAGE_ID = "74b8d59289c14f16ad639b2abe1d2863"  # gpulaunch/jobapi/record.py


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    with slurm_cluster(1) as c:
        yield c


def _example(command: str) -> str:
    """The example batch script with `command` run by its srun."""
    lines = EXAMPLE.read_text().splitlines(keepends=True)
    step = [i for i, line in enumerate(lines) if line.startswith("srun gpulaunch start ")]
    assert len(step) == 1, "the example's srun line"
    lines[step[0]] = f"srun {command}\n"
    return "".join(lines)


def _submit(cluster: Cluster, name: str, command: str) -> tuple[str, Path]:
    """The example, running `gpulaunch start --job NAME --nproc 1 --grace 1 COMMAND` (with
    {dir} in COMMAND the job's directory), on one of the box's 2 GPUs."""
    jobdir = SHARED / f"{name}-{uuid.uuid4().hex[:6]}"
    jobdir.mkdir(parents=True)
    os.chmod(jobdir, 0o777)
    start = f"{GPULAUNCH} start --job {jobdir.name} --nproc 1 --grace 1 "
    (jobdir / "job.sbatch").write_text(_example(start + command.format(dir=jobdir)))
    res = cluster.run(["sbatch", "--parsable", "--gpus-per-node=1", "job.sbatch"], cwd=str(jobdir))
    assert res.returncode == 0, res.stderr
    return res.stdout.strip().split(";")[0], jobdir


def _ended(cluster: Cluster, job_id: str, jobdir: Path) -> str:
    """The job's output once Slurm says it ended for good (FAILED: not requeued again)."""
    wait_until(
        lambda: cluster.job_field(job_id, "JobState") in ("FAILED", "COMPLETED"),
        300,
        f"job {job_id} to end for good",
    )
    return "".join(p.read_text() for p in sorted(jobdir.glob("slurm-*.out")))


def _records(cluster: Cluster, job: str) -> list[dict[str, str]]:
    """Every run's journal record of the job, oldest first (the record file keeps the last)."""
    res = cluster.run(
        ["journalctl", "-o", "json", "--all", f"MESSAGE_ID={MESSAGE_ID}", f"GPULAUNCH_JOB={job}"]
    )
    return [json.loads(line) for line in res.stdout.splitlines()]


def test_requeue_me_until_max_requeues_is_spent(cluster: Cluster) -> None:
    """Every run fails once (never a crash loop: --crash-loop 0): 81 twice, requeued each
    time, then with 2 requeues made the rank's own status, 3."""
    job_id, jobdir = _submit(
        cluster, "requeues", f"--max-requeues 2 --crash-loop 0 {FAILING} --dir {{dir}} --status 3"
    )
    out = _ended(cluster, job_id, jobdir)
    assert cluster.job_field(job_id, "Restarts") == "2", out
    assert cluster.job_field(job_id, "ExitCode") == "3:0", out
    # each run's first attempt numbered after the last run's (TORCHELASTIC_RESTART_COUNT);
    # the first run has no SLURM_RESTART_COUNT
    assert (jobdir / "attempts").read_text().split("\n") == ["- 0", "1 1", "2 2", ""], out
    name = jobdir.name
    assert out.count(f"job {name} failed: rank 0 exit 3; restarts spent here (status 81: ") == 2
    assert "exit 81 for Slurm to requeue the job (requeue 1 of 2, --max-requeues)" in out, out
    assert "(requeue 2 of 2, --max-requeues)" in out, out
    assert f"job {name} failed: rank 0 exit 3 (status 3)" in out, out
    assert "run 3 of Slurm job" in out and "3 attempts over its runs" in out, out
    records = _records(cluster, name)
    assert [(r["GPULAUNCH_CAUSE"], r["GPULAUNCH_STATUS"]) for r in records] == [
        ("requeue", "81"),
        ("requeue", "81"),
        ("rank-failed", "3"),
    ], records
    runs = [json.loads(r["GPULAUNCH_SLURM_RUNS"]) for r in records]
    assert [(r["slurm_job"], r["run"], r["attempts"]) for r in runs] == [
        (job_id, 0, 1),
        (job_id, 1, 2),
        (job_id, 2, 3),
    ], runs
    status = json.loads(cluster.run([GPULAUNCH, "status", "--json", name]).stdout)
    assert (status["cause"], status["status"], status["restarts"]) == ("rank-failed", 3, 2)


def test_a_crash_loop_across_requeues_ends_the_job(cluster: Cluster) -> None:
    """--max-restarts 1, --crash-loop 3: the first run fails twice at once (81: requeued);
    the second run's first failure is the third in a row: 80, and Slurm requeues no more."""
    job_id, jobdir = _submit(
        cluster, "loop", f"--max-restarts 1 --max-requeues 5 {FAILING} --dir {{dir}} --status 4"
    )
    out = _ended(cluster, job_id, jobdir)
    assert cluster.job_field(job_id, "Restarts") == "1", out
    assert cluster.job_field(job_id, "ExitCode") == "80:0", out
    assert (jobdir / "attempts").read_text().split("\n") == ["- 0", "- 1", "1 2", ""], out
    name = jobdir.name
    assert f"job {name} failed: rank 0 exit 4; restarts spent here (status 81: " in out, out
    assert f"job {name} failed in a crash loop (--crash-loop): rank 0 exit 4 (status 80)" in out
    assert "3 attempts in a row failed this way (2 of them in earlier Slurm runs" in out, out
    records = _records(cluster, name)
    assert [(r["GPULAUNCH_CAUSE"], r["GPULAUNCH_STATUS"]) for r in records] == [
        ("requeue", "81"),
        ("crash-loop", "80"),
    ], records
    last = json.loads(records[-1]["GPULAUNCH_SLURM_RUNS"])
    assert (last["run"], last["attempts"], last["streak"]) == (1, 3, 3), last


def test_the_notice_requeues_the_job(cluster: Cluster) -> None:
    """`--signal=TERM@120`'s SIGTERM, to the steps' tasks (as `scancel --signal=TERM` sends
    it, the batch shell left alone): gpulaunch gives the rank its grace, the rank saves,
    gpulaunch exits 79, srun returns it and the script requeues the job; the next run
    resumes and completes."""
    job_id, jobdir = _submit(
        cluster, "notice", f"--preempt-grace 15 {CHECKPOINT} --dir {{dir}} --save 0.5"
    )
    wait_until(lambda: (jobdir / "ready0").exists(), 120, "the rank of the first run")
    sent = cluster.run(["scancel", "--signal=TERM", job_id])
    assert sent.returncode == 0, sent.stderr
    out = _ended(cluster, job_id, jobdir)
    assert cluster.job_field(job_id, "JobState") == "COMPLETED", out
    assert cluster.job_field(job_id, "Restarts") == "1", out
    assert (jobdir / "ckpt0.json").exists() and (jobdir / "resumed0").read_text() == "1", out
    assert f"job {jobdir.name} preempted (status 79: requeue it)" in out, out
    records = _records(cluster, jobdir.name)
    assert [(r["GPULAUNCH_CAUSE"], r["GPULAUNCH_STATUS"]) for r in records] == [
        ("preempted", "79"),
        ("succeeded", "0"),
    ], records


def test_under_systemd_the_journal_record_carries_over(cluster: Cluster) -> None:
    """`--supervisor systemd` (the job on the box's system manager, published on its bus):
    no record file, so the next run finds the last one's state in the journal (`_UID=0`)."""
    job_id, jobdir = _submit(
        cluster,
        "journal",
        f"--supervisor systemd --max-requeues 1 --crash-loop 0 {FAILING} --dir {{dir}} --status 3",
    )
    out = _ended(cluster, job_id, jobdir)
    assert cluster.job_field(job_id, "Restarts") == "1", out
    assert cluster.job_field(job_id, "ExitCode") == "3:0", out
    assert (jobdir / "attempts").read_text().split("\n") == ["- 0", "1 1", ""], out
    records = _records(cluster, jobdir.name)
    assert [r["GPULAUNCH_MANAGER"] for r in records] == ["system", "system"], records
    runs = [json.loads(r["GPULAUNCH_SLURM_RUNS"]) for r in records]
    assert [(r["run"], r["attempts"]) for r in runs] == [(0, 1), (1, 2)], runs


def test_a_killed_watchers_attempts_carry_over(cluster: Cluster) -> None:
    """The watcher SIGKILLed (no end record): its record from the start still has the
    attempts, so the run after `scontrol requeue` numbers its attempt on."""
    job_id, jobdir = _submit(cluster, "killed", f"{CHECKPOINT} --dir {{dir}} --save 0.5")
    wait_until(lambda: (jobdir / "ready0").exists(), 120, "the rank of the first run")
    files = cluster.sh("for f in /run/gpulaunch/jobs/*.json; do cat $f; echo; done")
    record = next(
        r for r in map(json.loads, files.split("\n")[:-1]) if r["GPULAUNCH_JOB"] == jobdir.name
    )  # the record file (`status` would ask the watcher on the bus)
    assert json.loads(record["GPULAUNCH_SLURM_RUNS"]) == {
        "slurm_job": job_id, "run": 0, "attempts": 1, "streak": 0, "streak_class": "",
        "streak_status": 0,
    }, record  # fmt: skip
    cluster.sh(f"kill -KILL {record['GPULAUNCH_WATCHER_PID']}")
    wait_until(lambda: cluster.job_field(job_id, "JobState") != "RUNNING", 120, "srun's end")
    assert cluster.run(["scontrol", "requeue", job_id]).returncode == 0
    out = _ended(cluster, job_id, jobdir)
    assert cluster.job_field(job_id, "JobState") == "COMPLETED", out
    assert (jobdir / "attempts").read_text().split() == ["0:0", "0:1"], out
