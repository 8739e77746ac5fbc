"""What the cluster's tools read from a job (gpulaunch/schedulers/), under a real systemd and
the direct supervisor: DCGM's job map through a job's life and after a watcher SIGKILL, and
Kubernetes' termination message for every way a job ends."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from gpulaunch.schedulers.jobmap import jobs_on
from gpulaunch.schedulers.termination import LIMIT
from tests.fake_machine import FakeGpu, write_fake_machine
from tests.integration.jobs import REPO, Job, assert_clean, wait_until

pytestmark = pytest.mark.integration

MAPPED = str(REPO / "tests" / "integration" / "scripts" / "mapped.py")
CHECKPOINT = str(REPO / "tests" / "integration" / "scripts" / "checkpoint.py")
# dcgm-exporter's map must follow the job within a second (issue 38); the bound adds a
# second for a loaded 2-CPU machine.
MAP_BOUND = 2.0


def _mapped(job: Job, supervisor: str) -> tuple[subprocess.Popen[str], Path]:
    machine = write_fake_machine(
        job.dir / "machine", [FakeGpu("0000:1b:00.0", 0), FakeGpu("0000:3d:00.0", 1)]
    )
    jobmap = job.dir / "map"
    jobmap.mkdir()
    jobmap.joinpath("1").write_text("someone-else\n")  # another job on GPU 1 stays
    proc = job.popen(
        "--nproc", "2", "--machine-root", str(machine), "--gpus", "0,1", "--supervisor",
        supervisor, "--gpu-job-map", str(jobmap), script=MAPPED, script_args=["--map", str(jobmap)],
    )  # fmt: skip
    for rank in (0, 1):
        job.wait_file(f"rank{rank}.ready")
    return proc, jobmap


@pytest.mark.parametrize("supervisor", ["systemd", "direct"])
def test_the_job_map_names_the_job_before_its_ranks_and_not_after(
    job: Job, supervisor: str
) -> None:
    proc, jobmap = _mapped(job, supervisor)
    for rank in (0, 1):  # already there when each rank began
        seen = json.loads((job.dir / f"rank{rank}.map").read_text())
        assert seen == {"0": [job.id], "1": ["someone-else", job.id]}, seen
    (job.dir / "end").write_text("")
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert jobs_on(jobmap) == {1: ["someone-else"]}  # gone when the launcher has exited
    assert_clean(job)


@pytest.mark.parametrize("supervisor", ["systemd", "direct"])
def test_a_killed_watchers_job_leaves_the_map(job: Job, supervisor: str) -> None:
    """systemd: the anchor's ExecStopPost=; direct: the keeper, once the ranks are gone."""
    proc, jobmap = _mapped(job, supervisor)
    watcher = job.box.inner_pid(proc)  # (host pids)
    if supervisor == "direct":  # the launcher is the keeper; the watcher is its child
        watcher = _child(watcher)
    killed = time.monotonic()
    os.kill(watcher, signal.SIGKILL)
    took = wait_until(lambda: jobs_on(jobmap) == {1: ["someone-else"]}, 30, "the map")
    assert took <= MAP_BOUND, f"the map still named the job {took:.2f} s after the kill"
    proc.communicate(timeout=60)
    assert time.monotonic() - killed < 60


def _child(pid: int) -> int:
    """The direct supervisor's watcher, below its keeper (host pids): the keeper's child that
    runs gpulaunch (its other child is the sentinel, a plain `sh`: supervisor/sentinel.py)."""
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    (watcher,) = [c for c in children if b"gpulaunch" in Path(f"/proc/{c}/cmdline").read_bytes()]
    return int(watcher)


def _message(path: Path) -> list[str]:
    data = path.read_bytes()
    assert 0 < len(data) <= LIMIT, len(data)
    return data.decode().splitlines()


@pytest.mark.parametrize(
    ("opts", "args", "status", "head"),
    [
        ((), ["--sleep", "0"], 0, r"job {job} succeeded \(all 2 ranks exited 0\)$"),
        ((), ["--exit", "3"], 3, r"job {job} failed: rank [01] exit 3 \(status 3\)$"),
        (("--max-restarts", "5"), ["--exit", "3"], 80, r"job {job} failed in a crash loop"),
    ],
    ids=["success", "exit-3", "crash-loop"],
)
def test_the_termination_message_says_how_the_job_ended(
    job: Job, opts: tuple[str, ...], args: list[str], status: int, head: str
) -> None:
    path = job.dir / "termination-log"
    res = job.run(
        "--nproc", "2", "--termination-log", str(path), *opts, script=CHECKPOINT, script_args=args
    )  # fmt: skip
    assert res.returncode == status, res.stderr
    lines = _message(path)
    assert re.match(head.format(job=job.id), lines[0]), lines
    assert f"status {status}" in lines[1], lines
    if status:  # the cause rank, the attempt, and the error's end
        assert re.search(r"; rank [01]; attempt \d", lines[1]), lines
    assert_clean(job)


@pytest.mark.parametrize("supervisor", ["systemd", "direct"])
def test_a_preempted_job_says_so_for_kubernetes(job: Job, supervisor: str) -> None:
    path = job.dir / "termination-log"
    proc = job.popen(
        "--nproc", "2", "--preempt-grace", "10", "--supervisor", supervisor,
        "--termination-log", str(path), script=CHECKPOINT, script_args=["--save", "0.5"],
    )  # fmt: skip
    for rank in (0, 1):
        job.wait_file(f"ready{rank}")
    os.kill(job.box.inner_pid(proc), signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 79, err
    lines = _message(path)
    assert lines[0] == f"job {job.id} preempted (status 79: requeue it)", lines
    assert lines[1].startswith("cause: preempted; status 79"), lines


def test_a_killed_watcher_is_told_by_its_keeper(job: Job) -> None:
    """The direct supervisor (a container's entry point): the keeper writes the message."""
    path = job.dir / "termination-log"
    proc = job.popen(
        "--nproc", "1", "--supervisor", "direct", "--termination-log", str(path),
        script_args=["--sleep", "300"],
    )  # fmt: skip
    job.wait_file("rank0.pid")
    os.kill(_child(job.box.inner_pid(proc)), signal.SIGKILL)  # the keeper's child
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL  # the keeper ends as the watcher did
    lines = _message(path)
    assert lines[0].startswith(f"job {job.id} ended: its watcher was killed by SIGKILL"), lines
    assert lines[1] == "cause: watcher-killed; status 137", lines


def test_a_start_error_is_the_message(job: Job) -> None:
    path = job.dir / "termination-log"
    res = job.run("--termination-log", str(path), "--gpu-job-map", "/nonexistent/map")
    assert res.returncode == 2, res.stderr
    lines = _message(path)
    assert lines[0].startswith("error: --gpu-job-map /nonexistent/map: no such directory"), lines
    assert lines[1] == "cause: start-failed; status 2", lines
