"""Seeing inside a running job (issue 17, items 3-5): `gpulaunch stacks`, --hang-timeout,
--dump-stacks, and what a rank's @record error file does (explains, never stops)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from tests.integration.jobs import REPO, Job, assert_clean
from tests.integration.shared import finish, gl, start_running

pytestmark = pytest.mark.integration

SCRIPTS = REPO / "tests" / "integration" / "scripts"


def line_of(script: Path, text: str) -> int:
    """The 1-based line of `text` in `script` (so the test follows edits of the script)."""
    return next(i for i, line in enumerate(script.read_text().splitlines(), 1) if text in line)


def test_stacks_name_each_ranks_function_and_line(job: Job) -> None:
    proc = start_running(job, 2)
    try:
        res = gl(job, "stacks", job.id, timeout=120)
        assert res.returncode == 0, res.stderr
        sleep_line = line_of(SCRIPTS / "rank.py", "time.sleep(args.sleep)")
        for rank in (0, 1):
            assert f"rank {rank} ({job.names.rank_scope(rank)}, pid " in res.stdout, res.stdout
        assert res.stdout.count(f"main (rank.py:{sleep_line})") == 2, res.stdout
        one = gl(job, "stacks", job.id, "--rank", "1", timeout=120)
        assert one.returncode == 0, one.stderr
        assert "rank 1 (" in one.stdout and "rank 0 (" not in one.stdout, one.stdout
    finally:
        finish(job, proc)


def test_stacks_fail_when_no_rank_could_be_read(job: Job) -> None:
    """Issue 22 item 9: ranks py-spy cannot read (not Python): each says why, exit 69."""
    proc = job.popen("--nproc", "2", "--no-python", script=str(SCRIPTS / "plain_sleep.sh"))
    try:
        for rank in (0, 1):
            job.wait_file(f"rank{rank}.ready")
        res = gl(job, "stacks", job.id, timeout=120)
        assert res.returncode == 69, (res.stdout, res.stderr)
        assert "no stacks of job" in res.stderr and "2 ranks tried" in res.stderr, res.stderr
        assert res.stdout.count(": no stacks: ") == 2, res.stdout
    finally:
        finish(job, proc)


SLOW_TEARDOWN = str(SCRIPTS / "slow_teardown.py")


@pytest.mark.parametrize("recorded", [True, False], ids=["record", "no-record"])
def test_the_failing_rank_s_exit_stops_the_others(job: Job, recorded: bool) -> None:
    """The others get SIGTERM when rank 1 exits (not at its error file: issue 22 item 6);
    with @record the report shows its error file."""
    res = job.run(
        "--nproc",
        "3",
        script=SLOW_TEARDOWN,
        script_args=[] if recorded else ["--no-record"],
        timeout=180,
    )
    assert res.returncode == 1, res.stderr
    assert "failed: rank 1 exit 1" in res.stderr, res.stderr
    assert ("its error file (@record)" in res.stderr) is recorded, res.stderr
    exited = float((job.dir / "rank1.exit").read_text())
    for rank in (0, 2):
        termed = float((job.dir / f"rank{rank}.term").read_text())
        assert termed > exited, (rank, termed, exited)
    assert_clean(job)


@pytest.mark.parametrize("recorded", [True, False], ids=["record", "no-record"])
def test_a_rank_that_only_lost_its_peer_is_not_named_the_cause(job: Job, recorded: bool) -> None:
    """Rank 1 raises and tears down slowly; rank 2, its partner, aborts on "Connection closed
    by peer" first (as in CI, issue 22's Lightning test): rank 1 is the cause, exit 1, and
    the others are stopped only after it ended (watcher/origin.py; with @record, its file)."""
    res = job.run(
        "--nproc",
        "3",
        script=SLOW_TEARDOWN,
        script_args=["--victim-rank", "2"] + ([] if recorded else ["--no-record"]),
        timeout=180,
    )
    assert res.returncode == 1, res.stderr
    assert "failed: rank 1 exit 1" in res.stderr, res.stderr
    assert "rank 1 fails on purpose" in res.stderr[res.stderr.index("failed: rank 1") :]
    exited = float((job.dir / "rank1.exit").read_text())
    assert float((job.dir / "rank0.term").read_text()) > exited, res.stderr
    assert_clean(job)


@pytest.mark.parametrize("who", ["direct", "user"])
def test_the_rank_that_raised_is_the_cause_under_either_supervisor_and_for_a_user(
    box: Any, job: Job, who: str
) -> None:
    """The same without @record, where users run: the direct supervisor (a container, a
    Slurm step), and an ordinary user's login shell (the front end and their manager)."""
    args = ["--victim-rank", "2", "--no-record"]
    if who == "direct":
        res = job.run("--supervisor", "direct", "--nproc", "3", script=SLOW_TEARDOWN,
                      script_args=args, timeout=180)  # fmt: skip
    else:
        from tests.integration.shared import assert_user_clean, make_user

        login = make_user(box, "glorigin", manager=True)
        job.dir.chmod(0o777)
        res = login.run(job.argv("--nproc", "3", script=SLOW_TEARDOWN, script_args=args))
    assert res.returncode == 1, res.stderr
    assert "failed: rank 1 exit 1" in res.stderr, res.stderr
    exited = float((job.dir / "rank1.exit").read_text())
    assert float((job.dir / "rank0.term").read_text()) > exited, res.stderr
    if who == "user":
        assert_user_clean(login, job)
    else:
        assert job.alive() == []


def test_an_error_file_then_exit_0_stops_nobody(job: Job) -> None:
    """Rank 1's @record writes its error file, then it catches the exception and exits 0:
    the others run to their end, and the job succeeded (issue 22 item 6)."""
    res = job.run(
        "--nproc", "3", script=SLOW_TEARDOWN, script_args=["--catch", "--sleep", "4"], timeout=180
    )
    assert res.returncode == 0, res.stderr
    assert "succeeded (all 3 ranks exited 0)" in res.stderr, res.stderr
    assert not list(job.dir.glob("rank*.term")), res.stderr
    assert_clean(job)


SKIP_ALLREDUCE = str(SCRIPTS / "skip_allreduce.py")


def test_a_hang_is_found_and_the_stacks_say_who_waits_for_whom(job: Job) -> None:
    """Rank 1 skips an all_reduce: ranks 0, 2, 3 wait in it; --hang-timeout 3 finds it."""
    started = time.monotonic()
    res = job.run("--nproc", "4", "--hang-timeout", "3", script=SKIP_ALLREDUCE, timeout=300)
    took = time.monotonic() - started
    assert res.returncode == 124, res.stderr
    head = [line for line in res.stderr.splitlines() if " hung: " in line]
    assert len(head) == 1 and head[0].startswith(f"gpulaunch: job {job.id} hung"), res.stderr
    lines = Path(SKIP_ALLREDUCE).read_text().splitlines()
    called = max(i for i, line in enumerate(lines, 1) if "dist.all_reduce(t)" in line)
    assert f"ranks 0, 2, 3 in all_reduce called from main (skip_allreduce.py:{called})" in head[0]
    assert "rank 1 not in a collective: elsewhere (skip_allreduce.py:" in head[0], res.stderr
    assert "the ranks' stacks" in res.stderr, res.stderr
    assert "    all_reduce (torch/distributed/distributed_c10d.py:" in res.stderr, res.stderr
    stacks_file = next(p for p in res.stderr.split() if p.endswith(".stacks.txt)"))[:-1]
    assert job.box.run(["test", "-s", stacks_file]).returncode == 0
    assert took < 240, took  # torch's import on a loaded machine, then 3 s to 4.5 s
    assert_clean(job)


def test_dump_stacks_shows_the_survivors_when_a_rank_fails(job: Job) -> None:
    res = job.run(
        "--nproc",
        "3",
        "--dump-stacks",
        "--log-dir",
        str(job.dir / "logs"),
        script=SKIP_ALLREDUCE,
        script_args=["--fail-rank", "2", "--skip-rank", "-1"],
        timeout=300,
    )
    assert res.returncode == 3, res.stderr
    assert "failed: rank 2 exit 3" in res.stderr, res.stderr
    assert "the ranks' stacks" in res.stderr, res.stderr
    for rank in (0, 1):
        assert f"rank {rank} (" in res.stderr.split("the ranks' stacks")[1]
    # where the survivors were, named as for a hang (issue 26 item 2)
    where = [line for line in res.stderr.splitlines() if line.startswith("where the other ranks")]
    assert len(where) == 1, res.stderr
    for rank in (0, 1):
        assert f"rank {rank} not in a collective: elsewhere (skip_allreduce.py:" in where[0]
    text = (job.dir / "logs" / f"{job.names.component}.stacks.txt").read_text()
    assert text.startswith("rank 2 exit 3"), text
    assert text.count("elsewhere (skip_allreduce.py:") == 2, text  # ranks 0 and 1
    assert_clean(job)
