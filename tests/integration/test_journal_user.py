"""An ordinary user's job: what the journal kept of its ranks is counted in the user
manager's ranks slice (issue 35): nothing said when nothing is missing, the shortfall
when something is."""

from __future__ import annotations

import os
from typing import Any

import pytest

from tests.integration.jobs import Job
from tests.integration.shared import TALK, Login, assert_user_clean, make_user

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def login(box: Any) -> Login:
    return make_user(box, "gljournal", manager=True)


def test_a_user_jobs_lines_are_counted_in_its_ranks_slice(login: Login, job: Job) -> None:
    os.chmod(job.dir, 0o777)
    argv = job.argv("--nproc", "2", script=TALK, script_args=["--lines", "3", "--blank", "1"])
    res = login.run(argv)
    assert res.returncode == 0, res.stderr
    assert "journal" not in res.stderr, res.stderr  # all kept: nothing to say
    assert res.stdout.count("\n") == 8
    assert_user_clean(login, job)
