"""Root's way to an ordinary user's jobs (gpulaunch/jobapi/whose.py): the pure parts."""

from __future__ import annotations

import os
import pwd
from pathlib import Path

import pytest

from gpulaunch.errors import UsageError
from gpulaunch.jobapi import whose


def user_slice(root: Path, uid: int, job_slice: str) -> Path:
    path = root / f"user.slice/user-{uid}.slice/user@{uid}.service/gpulaunch.slice" / job_slice
    path.mkdir(parents=True)
    return path


def test_the_owners_of_a_running_job_come_from_the_cgroup_tree(tmp_path: Path) -> None:
    me = pwd.getpwuid(os.getuid()).pw_name
    user_slice(tmp_path, os.getuid(), "gpulaunch-exp1.slice")
    user_slice(tmp_path, 4242424, "gpulaunch-exp2.slice")  # a uid without a name
    assert whose.owners_of("gpulaunch-exp1.slice", tmp_path) == [me]
    assert whose.owners_of("gpulaunch-exp2.slice", tmp_path) == ["4242424"]
    assert whose.owners_of("gpulaunch-nope.slice", tmp_path) == []
    assert whose.users_with_jobs(tmp_path) == sorted([me, "4242424"])
    assert whose.user_of_hint(["a", "b"]) == "--user-of a or --user-of b"
    assert whose.user_of_hint([]) is None


@pytest.mark.skipif(os.geteuid() != 0, reason="as an ordinary user: tests/integration")
def test_resolve_names_uids_and_refuses_root_and_strangers() -> None:
    with pytest.raises(UsageError, match="root's jobs are on the system bus"):
        whose.resolve("root")
    with pytest.raises(UsageError, match="no user 'no-such-user-here'"):
        whose.resolve("no-such-user-here")
    with pytest.raises(UsageError, match="no user '99999999999999999999'"):
        whose.resolve("99999999999999999999")
    nobody = whose.resolve("nobody")
    assert whose.resolve(str(nobody.uid)) == nobody
    assert nobody.bus_address == f"unix:path=/run/user/{nobody.uid}/bus"
