"""Limits on open files and processes: any limit a login shell has works (issue 13).

Every job here runs under `prlimit`, so the limits are the test's whatever
pytest runs under (scripts/test.sh: a soft limit of 1024).
"""

from __future__ import annotations

import re
import resource

import pytest

from tests.integration.jobs import REPO, Job, assert_clean

pytestmark = pytest.mark.integration


def run_limited(job: Job, soft: int, hard: int, *opts: str) -> tuple[int, str, str]:
    res = job.box.run(
        ["prlimit", f"--nofile={soft}:{hard}", "--", *job.argv(*opts, script_args=["--nofile"])],
        cwd=str(REPO),
        capture_output=True,
        text=True,
        timeout=300,
    )
    return res.returncode, res.stdout, res.stderr


def rank_limits(stdout: str) -> dict[int, tuple[int, int]]:
    found = re.findall(r"rank (\d+) nofile (\d+) (\d+)", stdout)
    return {int(r): (int(s), int(h)) for r, s, h in found}


def test_login_shell_limit_of_1024(job: Job) -> None:
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]  # the box cannot raise it
    code, out, err = run_limited(job, 1024, hard, "--nproc", "2")
    assert code == 0, err
    # the ranks see the limit the user had
    assert rank_limits(out) == {0: (1024, hard), 1: (1024, hard)}
    assert_clean(job)


def test_job_too_big_for_the_hard_limit_fails_before_starting(job: Job) -> None:
    code, out, err = run_limited(job, 64, 64, "--nproc", "16")
    assert code == 2, err
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("gpulaunch: error: a job of 16 ranks needs about "), err
    assert "hard limit on open files (64, see 'ulimit -Hn')" in lines[0]
    assert "LimitNOFILE=" in lines[0]
    assert not job.pids()  # no rank was started
    assert not job.units()  # nothing was created
    assert_clean(job)


def test_job_above_the_soft_limit_within_the_hard_one(job: Job) -> None:
    # 64 ranks need more fds than 256: the watcher raises its own soft limit,
    # and each rank still sees 256.
    code, out, err = run_limited(
        job, 256, 4096, "--nproc", "64", "--quiet", "--log-dir", str(job.dir)
    )
    assert code == 0, err
    logs = "".join((job.dir / f"rank{r}.log").read_text() for r in range(64))
    assert rank_limits(logs) == {r: (256, 4096) for r in range(64)}
    assert_clean(job)
