"""`python train.py` with Trainer or Fabric `strategy="gpulaunch"` (issue 31).

The real Trainer and Fabric on CPU (gloo), in the box: the process the test starts is
the one a user starts, and it becomes gpulaunch's watcher (gpulaunch/integrations/).
scripts/lightning_strategy.py writes what each process saw.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

import pytest

from tests.integration.jobs import GPULAUNCH, REPO, Job, assert_clean, wait_until

pytestmark = pytest.mark.integration

SCRIPT = str(REPO / "tests" / "integration" / "scripts" / "lightning_strategy.py")


def argv(job: Job, *args: str) -> list[str]:
    return [sys.executable, SCRIPT, "--dir", str(job.dir), "--job", job.id, *args]


def run(job: Job, *args: str) -> subprocess.CompletedProcess[str]:
    return job.box.run(argv(job, *args), cwd=str(REPO), capture_output=True, text=True, timeout=300)


def load(job: Job, name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((job.dir / name).read_text())
    return data


def original_pid(job: Job) -> int:
    return int((job.dir / "original.pid").read_text())


@pytest.mark.parametrize("kind", ["trainer", "fabric"])
def test_a_two_rank_job_succeeds_with_the_started_process_as_every_rank_s_parent(
    job: Job, kind: str
) -> None:
    res = run(job, "--kind", kind, "--by-name")
    assert res.returncode == 0, res.stderr[-3000:]
    parent = original_pid(job)
    # by name, with gpulaunch's default id: the script's name and a random part
    job = Job(box=job.box, id=load(job, "rank0.json")["GPULAUNCH_JOB"], dir=job.dir)
    assert job.id.startswith("lightning_strategy_")
    for rank in (0, 1):
        seen = load(job, f"rank{rank}.json")
        assert seen["ppid"] == parent  # the process `python train.py` started: the watcher
        assert seen["LOCAL_RANK"] == str(rank)  # rank 0 too
        assert seen["GPULAUNCH_JOB"] == job.id
        done = load(job, f"done{rank}.json")
        assert done["world_size"] == 2
        assert done["environment"] == "TorchElasticEnvironment"
        # the strategy destroyed the process group before the interpreter's teardown
        # (torch 2.13's gloo otherwise aborts about one exit in fifteen, torchrun's too)
        assert load(job, f"exit{rank}.json") == {"initialized": False}
    # the script before Trainer/Fabric: once in the process started, once in each rank
    assert len((job.dir / "before.txt").read_text().split()) == 3
    if kind == "trainer":  # fit, validate, test, predict, fit again; rank 0's checkpoint
        assert load(job, "done0.json")["strategy"] == "GpulaunchStrategy"
        assert load(job, "done0.json")["predictions"] > 0
        assert (job.dir / "model.ckpt").stat().st_size > 0
    else:
        assert load(job, "done0.json")["strategy"] == "GpulaunchFabricStrategy"
    assert job.record()["GPULAUNCH_STATUS"] == "0"
    assert_clean(job)


@pytest.mark.parametrize("kind", ["trainer", "fabric"])
def test_rank_1_exits_7_at_step_5_and_python_train_py_exits_7_with_the_report(
    job: Job, kind: str
) -> None:
    # Fabric: the loop in fabric.launch(fn), where the strategy sees the rank fail
    launch_fn = ["--launch-fn"] if kind == "fabric" else []
    res = run(
        job, "--kind", kind, "--fail-rank", "1", "--fail-step", "5", "--exit-code", "7", *launch_fn
    )
    assert res.returncode == 7, res.stderr[-3000:]
    assert f"gpulaunch: job {job.id} failed: rank 1 exit 7 (status 7)" in res.stderr
    # the strategy wrote the error file as the rank began to fail
    assert "SystemExit: 7" in res.stderr[res.stderr.index("failed: rank 1") :]
    assert_clean(job)


def test_the_m_form_interpreter_options_and_cwd_reach_every_rank(job: Job) -> None:
    scripts = REPO / "tests" / "integration" / "scripts"
    args = ["--dir", str(job.dir), "--job", job.id, "--kind", "fabric"]
    typed = [sys.executable, "-B", "-m", "lightning_strategy", *args]
    res = job.box.run(typed, cwd=str(scripts), capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    for rank in (0, 1):
        seen = load(job, f"rank{rank}.json")
        assert seen["cmdline"] == [sys.executable, "-u", *typed[1:]]
        assert seen["cwd"] == str(scripts)
    assert_clean(job)


def running_job(job: Job) -> tuple[subprocess.Popen[str], int]:
    proc = job.box.popen(
        argv(job, "--hold"),
        cwd=str(REPO),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    for rank in (0, 1):
        job.wait_file(f"rank{rank}.json", timeout=180)
    return proc, original_pid(job)


def ppid_in_box(job: Job, pid: int) -> int:
    stat = job.box.run(["cat", f"/proc/{pid}/stat"], capture_output=True, text=True, check=True)
    return int(stat.stdout.rsplit(")", 1)[1].split()[1])


def test_while_it_runs_the_job_is_gpulaunch_s_and_a_sigkill_of_python_leaves_nothing(
    job: Job,
) -> None:
    proc, parent = running_job(job)
    try:
        ranks = {name: pid for name, pid in job.pids().items() if name.startswith("rank")}
        assert sorted(ranks) == ["rank0", "rank1"]
        assert all(ppid_in_box(job, pid) == parent for pid in ranks.values())  # while running
        listed = job.box.run([GPULAUNCH, "list"], capture_output=True, text=True, check=True)
        assert job.id in listed.stdout
        status = job.box.run(
            ["systemctl", "status", job.names.rank_scope(0)], capture_output=True, text=True
        )
        assert status.returncode == 0 and "active (running)" in status.stdout, status.stdout
        job.box.run(["kill", "-KILL", str(parent)], check=True)
        assert proc.wait(timeout=60) == -signal.SIGKILL or proc.returncode == 128 + 9
        wait_until(lambda: job.alive() == [], 60, "the ranks to be gone")
        assert_clean(job)
    finally:  # the watcher in the box holds the pipes: it goes first
        job.box.run(["kill", "-KILL", str(parent)], capture_output=True)
        proc.communicate(timeout=60)


def as_user(login: Any, job: Job, args: Sequence[str]) -> subprocess.CompletedProcess[str]:
    result: subprocess.CompletedProcess[str] = login.run(argv(job, *args), timeout=300)
    return result


def test_an_ordinary_user_s_python_train_py_runs_under_the_front_end(box: Any, job: Job) -> None:
    from tests.integration.shared import assert_user_clean, make_user

    login = make_user(box, "gllightning", manager=True)
    job.dir.chmod(0o777)
    res = as_user(login, job, ["--fail-rank", "1", "--fail-step", "5", "--exit-code", "7"])
    assert res.returncode == 7, res.stderr[-3000:]
    assert f"gpulaunch: job {job.id} failed: rank 1 exit 7 (status 7)" in res.stderr
    assert load(job, "rank0.json")["LOCAL_RANK"] == "0"
    # the watcher is the user manager's service, the front end the process the user started
    assert load(job, "rank0.json")["ppid"] == load(job, "rank1.json")["ppid"] != original_pid(job)
    assert_user_clean(login, job)
