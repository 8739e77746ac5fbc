"""The direct supervisor's pure parts: choosing it, notices, the record file, /proc trees."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from gpulaunch.base.slurm import resource_manager_step
from gpulaunch.cli import _notice
from gpulaunch.jobapi import filerecord
from gpulaunch.jobapi.rankview import RankView
from gpulaunch.jobapi.view import JobState, JobView
from gpulaunch.supervisor.pgroups import descendants


@pytest.mark.parametrize(
    ("text", "signum"),
    [("USR1", signal.SIGUSR1), ("sigusr2", signal.SIGUSR2), ("SIGUSR1", signal.SIGUSR1),
     (str(int(signal.SIGUSR2)), signal.SIGUSR2)],
)  # fmt: skip
def test_notices_by_name_or_number(text: str, signum: int) -> None:
    assert _notice(text) == signum


@pytest.mark.parametrize("text", ["KILL", "9", "HUP", "usr3", ""])
def test_other_signals_are_neither_a_notice_nor_a_stop(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="not a notice"):
        _notice(text)


@pytest.mark.parametrize(
    ("text", "signum"),
    [("TERM", signal.SIGTERM), ("sigint", signal.SIGINT), ("15", signal.SIGTERM)],
)
def test_signal_takes_sigterm_and_sigint_as_stops(text: str, signum: int) -> None:
    """Issue 35 item 5: `gpulaunch signal JOB TERM|INT` stops a job (its watcher gets it)."""
    assert _notice(text) == signum


def test_a_slurm_step_is_a_resource_managers_cgroup() -> None:
    assert resource_manager_step({"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0"}) == "Slurm step 7.0"
    # sbatch's batch script: a job, but not a step (srun makes one)
    assert resource_manager_step({"SLURM_JOB_ID": "7"}) is None
    assert resource_manager_step({}) is None


def _view(state: JobState, status: int = -1) -> JobView:
    rank = RankView(
        rank=0, local_rank=0, unit="u", pid=5, state="running", exit_code=-1, signal=0,
        stopped_by_watcher=False, status=-1, runtime=0.0,
    )  # fmt: skip
    return JobView(
        job="a/b job", slice="s", manager="user", owner=os.getuid(), watcher_pid=os.getpid(),
        state=state, world_size=1, ranks=(rank,), status=status,
        cause="succeeded" if status == 0 else "",
    )  # fmt: skip


def test_the_record_file_is_read_back(tmp_path: Path) -> None:
    filerecord.write(_view(JobState.RUNNING), "started", tmp_path)
    found = filerecord.find("a/b job", tmp_path)
    assert found is not None and found.state is JobState.RUNNING and found.ended_at == 0
    filerecord.write(_view(JobState.SUCCEEDED, 0), "succeeded", tmp_path)
    found = filerecord.find("a/b job", tmp_path)
    assert found is not None and found.state is JobState.SUCCEEDED and found.status == 0
    assert found.ended_at > 0 and found.watcher_pid == os.getpid()
    assert [v.job for v in filerecord.recent(tmp_path)] == ["a/b job"]
    assert (
        tmp_path / f"{filerecord.path_of('a/b job', tmp_path).name}"
    ).stat().st_mode & 0o077 == 0
    assert filerecord.find("other", tmp_path) is None


def test_descendants_follow_parentage_and_process_groups() -> None:
    # sh (its own group) starts sleep in the background: both found from us; skip prunes.
    child = subprocess.Popen(
        ["sh", "-c", "sleep 60 & echo $!; wait"],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert child.stdout is not None
        grandchild = int(child.stdout.readline())
        found = {p.pid for p in descendants([os.getpid()], set(), set())}
        assert {child.pid, grandchild} <= found
        assert child.pid not in {p.pid for p in descendants([os.getpid()], set(), {child.pid})}
        assert grandchild not in {p.pid for p in descendants([os.getpid()], set(), {child.pid})}
        # by process group alone, from no root
        assert {child.pid, grandchild} <= {p.pid for p in descendants([], {child.pid}, set())}
    finally:
        os.killpg(child.pid, signal.SIGKILL)
        child.wait()
    assert sys.platform == "linux"
