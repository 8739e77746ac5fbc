"""A rank never waits on journald (issue 27, item 1): with journald frozen, every line
still reaches the terminal and `--log-dir` at the rank's pace; what the journal could not
take is left out of it, counted exactly, and the report and record say why.

Before: the pump held up to 16 MiB for journald, then stopped reading the rank's pipe,
and the rank blocked in write(2) until journald caught up.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator

import pytest

from tests.integration.jobs import REPO, Job
from tests.integration.shared import TALK, journal_count

pytestmark = pytest.mark.integration

NO_RATE_LIMIT = "[Journal]\nRateLimitIntervalSec=0\n"  # the pump may send journald everything
LINES = 1_200_000  # ~22 MiB: more than the pump holds for journald (JOURNAL_BACKLOG)
THAW_AFTER_S = 300  # runaway protection only: journald is thawed then, and the test fails


@pytest.fixture
def frozen_job(box: object) -> Iterator[Job]:
    from sdbox import Box
    from tests.integration.conftest import box_files
    from tests.integration.jobs import new_job

    if not isinstance(box, Box):
        pytest.skip("needs the throwaway box: it stops this host's journald")
    files = {**box_files(), "etc/systemd/journald.conf.d/60-no-limit.conf": NO_RATE_LIMIT}
    with Box(binds=[REPO], files=files) as own:
        yield new_job(own, "journal-pace")


def test_a_frozen_journald_holds_no_rank_back(frozen_job: Job) -> None:
    job = frozen_job
    stop = ["systemctl", "kill", "--signal=SIGSTOP", "systemd-journald.service"]
    job.box.run(stop, check=True)
    thaw = ["systemctl", "kill", "--signal=SIGCONT", "systemd-journald.service"]
    watchdog = threading.Timer(THAW_AFTER_S, lambda: job.box.run(thaw))
    watchdog.start()
    try:
        proc = job.popen("--nproc", "1", script=TALK, script_args=["--lines", str(LINES)])
        assert proc.stdout is not None and proc.stderr is not None
        last = f"[0] rank 0 line {LINES - 1}\n"
        seen = 0
        for line in proc.stdout:
            seen += 1
            if line == last:
                break
        # every line arrived while journald was still frozen
        assert watchdog.is_alive(), "the rank waited for journald"
        assert seen == LINES
    finally:
        watchdog.cancel()
        job.box.run(thaw, check=True)
    rest, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    assert rest == ""
    lacks = f"of rank 0's {LINES} lines (journald took them slower than the rank wrote them"
    assert lacks in err, err
    (drop,) = json.loads(job.record()["GPULAUNCH_LOG_DROPS"])
    assert drop["crowded"] and drop["written"] == LINES and drop["stored"] < LINES
    job.box.run(["journalctl", "--sync"], check=True)
    assert journal_count(job, job.names.rank_scope(0)) == drop["stored"]
    assert f"the journal lacks {LINES - drop['stored']} of rank 0's" in err


def test_direct_supervisor_counts_what_the_journal_kept_by_the_pumps(job: Job) -> None:
    """The direct supervisor makes no units: the journal knows a rank's lines by the pid of
    its log pump. Before, it was asked for the rank scope's lines, found none, and every
    job warned that journald had not kept any of them."""
    res = job.run("--supervisor", "direct", "--nproc", "2", script=TALK)
    assert res.returncode == 0, res.stderr
    assert "journald" not in res.stderr, res.stderr
    # Over the burst (10,000 per 30 s, journald's default): the pump sends the burst, and
    # the count is exact.
    res = job.run(
        "--supervisor", "direct", "--nproc", "1", script=TALK, script_args=["--lines", "10005"]
    )
    assert res.returncode == 0, res.stderr
    assert "journald dropped 5 of rank 0's 10005 lines" in res.stderr, res.stderr
