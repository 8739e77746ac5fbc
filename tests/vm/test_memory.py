"""--memory-max and --job-memory-max in a machine with the memory controller: a rank that
allocates past the limit is killed by the kernel, and every view of the job names the
OOM killer (report, status, status --json, wait, the journal record), as root (system
manager) and as an SSH user (user manager, through the front end)."""

from __future__ import annotations

import json

import pytest

from sdbox.vm import Machine
from tests.vm.vmjobs import new_job

KILLED = "killed by the OOM killer at"


@pytest.mark.parametrize("user", ["root", "alice"])
def test_memory_max_names_the_oom_killer_everywhere(vm: Machine, user: str) -> None:
    job = new_job(vm, user, "oom")
    res = job.start(
        "--nproc", "2", "--memory-max", "150M",
        script_args=("--hog-rank", "1", "--hog-mb", "400"),
    )  # fmt: skip
    out = res.stdout
    assert res.returncode == 137, out  # the cause rank's status: 128 + SIGKILL
    assert KILLED in out and "(limit 150.0 MiB)" in out, out
    assert "rank 1" in out, out
    status = job.run(f"gpulaunch status {job.id}")
    assert KILLED in status.stdout and "(limit 150.0 MiB)" in status.stdout, status
    waited = job.run(f"gpulaunch wait {job.id}")
    assert waited.returncode == 137, waited
    ranks = {r["rank"]: r for r in job.status_json()["ranks"]}
    oom = ranks[1]["oom"]
    assert oom["limit"] == 150 << 20 and oom["memory"] >= 140 << 20, ranks[1]
    assert oom["source"] == "memory.events", ranks[1]  # the cgroup's count, not a log line
    assert ranks[0]["oom"] is None and ranks[0]["stopped_by_watcher"], ranks[0]
    assert ranks[1]["usage"]["peak_source"] == "the unit's cgroup (memory.peak)", ranks[1]
    record = job.record()
    assert record["GPULAUNCH_STATUS"] == "137", record
    recorded = {r["rank"]: r for r in json.loads(record["GPULAUNCH_RANKS"])}
    assert recorded[1]["oom"] == oom, recorded


def test_job_memory_max_names_the_oom_killer(vm: Machine) -> None:
    job = new_job(vm, "alice", "jobmem")
    res = job.start(
        "--nproc", "2", "--job-memory-max", "200M",
        script_args=("--hog-rank", "0", "--hog-mb", "400"),
    )  # fmt: skip
    assert res.returncode == 137, res.stdout
    assert f"rank 0 {KILLED}" in res.stdout and "(limit 200.0 MiB)" in res.stdout, res.stdout
    ranks = {r["rank"]: r for r in job.status_json()["ranks"]}
    assert ranks[0]["oom"]["source"] == "memory.events", ranks[0]
    assert ranks[1]["oom"] is None and ranks[1]["stopped_by_watcher"], ranks[1]
