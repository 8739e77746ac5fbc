"""A preempted job under a real Slurm (one box, tests/integration/slurm.py): its exit is what
Slurm's requeue acts on (issue 25, item 4).

`sbatch --requeue` runs `gpulaunch start --preempt-grace` as the batch script's process;
the site requeues jobs that exit 79 (`RequeueExit=79` in slurm.conf, docs/recovery.md).
A SIGTERM to the batch step (what a preemption or `--signal=B:TERM@S` sends) is the notice:
the rank saves its checkpoint, gpulaunch exits 79, and Slurm puts the job back in the
queue (`Restarts=1`); run again, the rank sees SLURM_RESTART_COUNT=1 and finishes.
"""

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


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    with slurm_cluster(1) as c:
        print(f"\nslurm: 1 node idle {c.boot_seconds:.2f} s after the box began to boot")
        yield c


def test_a_preempted_job_is_requeued(cluster: Cluster) -> None:
    jobdir = SHARED / f"requeue-{uuid.uuid4().hex[:6]}"
    jobdir.mkdir(parents=True)
    os.chmod(jobdir, 0o777)
    script = (
        "#!/bin/sh\n"
        f"exec {GPULAUNCH} start --nproc 1 --grace 1 --preempt-grace 15 "
        f"{CHECKPOINT} --dir {jobdir} --save 3\n"
    )
    (jobdir / "job.sbatch").write_text(script)
    res = cluster.run(["sbatch", "--requeue", "--parsable", "job.sbatch"], cwd=str(jobdir))
    assert res.returncode == 0, res.stderr
    job_id = res.stdout.strip().split(";")[0]
    wait_until(lambda: (jobdir / "ready0").exists(), 120, "the rank of the first run")
    # A preemption's notice to the batch step (as `--signal=B:TERM@S` or PreemptMode=REQUEUE's
    # SIGTERM would send), only to the batch script's process: gpulaunch.
    sent = cluster.run(["scancel", "--batch", "--signal=TERM", job_id])
    assert sent.returncode == 0, sent.stderr
    wait_until(lambda: cluster.job_field(job_id, "Restarts") == "1", 120, "Slurm's requeue")
    ckpt = json.loads((jobdir / "ckpt0.json").read_text())
    assert ckpt["saved_in"] >= 3.0 and ckpt["grace"] == "15", ckpt
    output = "".join(p.read_text() for p in jobdir.glob("slurm-*.out"))
    assert "preempted (status 79: requeue it)" in output, output
    # Requeued, it runs again once the first run's credential expired (cred_expire, 15 s here).
    start = time.monotonic()
    wait_until(
        lambda: cluster.job_field(job_id, "JobState") in ("COMPLETED", "FAILED"),
        180,
        "the requeued job to end",
    )
    print(f"\nrequeued job {job_id} ran again and ended {time.monotonic() - start:.2f} s later")
    output = "".join(p.read_text() for p in jobdir.glob("slurm-*.out"))
    assert cluster.job_field(job_id, "JobState") == "COMPLETED", f"{cluster.logs()}\n{output}"
    assert cluster.job_field(job_id, "ExitCode") == "0:0"
    assert (jobdir / "resumed0").read_text() == "1"
