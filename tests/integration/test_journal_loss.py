"""Lines journald took and did not keep are counted, exactly, whatever the cause (issue 22,
item 18): the report and the record say how many of each rank's lines the journal lacks.

The journal-volume test once saw 194,845 of 200,000 lines with the rate limit lifted and
nothing in the report: gpulaunch counted only ranks that wrote more than the burst, so a
loss for any other reason (journald's storage full or over its size limits, a write that
failed) was silent. Here journald is made to drop lines it received for a reason that is
not its rate limit (`MaxLevelStore=notice`: stdout, at info, is not stored), with the
packaged drop-in lifting the rate limit, as on a GPU node after `gpulaunch setup --journald`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from tests.integration.jobs import GPULAUNCH, REPO, Job
from tests.integration.shared import DROP_IN, TALK

pytestmark = pytest.mark.integration

NOT_STORED = "[Journal]\nMaxLevelStore=notice\n"  # stdout lines (info) are received, not stored


@pytest.fixture
def lossy_job(box: object) -> Iterator[Job]:
    from sdbox import Box
    from tests.integration.conftest import box_files
    from tests.integration.jobs import new_job

    if not isinstance(box, Box):
        pytest.skip("needs the throwaway box: it would change this host's journald")
    files = {
        **box_files(),
        "etc/systemd/journald.conf.d/60-gpulaunch.conf": DROP_IN,
        "etc/systemd/journald.conf.d/70-not-stored.conf": NOT_STORED,
    }
    with Box(binds=[REPO], files=files) as own:
        yield new_job(own, "journal-loss")


def test_lines_journald_did_not_keep_are_counted_in_report_and_record(lossy_job: Job) -> None:
    job = lossy_job
    # The rank exits 3 after its lines: a failure's record is at err, which is stored.
    # (One rank: a second one could be stopped by the first one's failure before it wrote.)
    args = ["--lines", "50", "--stderr", "1", "--crash"]
    res = job.run("--nproc", "1", script=TALK, script_args=args)
    assert res.returncode == 3, res.stderr
    # stderr lines (err) are stored, stdout lines (info) are not: 50 of the rank's 51.
    line = "gpulaunch: warning: journald did not keep 50 of rank 0's 51 lines (not its rate limit"
    assert line in res.stderr, res.stderr
    assert "journald dropped" not in res.stderr  # not called the rate limit's doing
    drops = json.loads(job.record()["GPULAUNCH_LOG_DROPS"])
    assert [(d["rank"], d["written"], d["stored"], d["rate_limited"]) for d in drops] == [
        (0, 51, 1, False)
    ]
    status = job.box.run([GPULAUNCH, "status", job.id], capture_output=True, text=True)
    assert "journald did not keep 50 of rank 0's 51 lines" in status.stdout, status
