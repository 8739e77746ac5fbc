"""What a direct job's dead watcher and keeper left: which record's cgroup may be ended
(gpulaunch/jobapi/leftovers.py). The ending itself, with real processes and cgroups:
tests/integration/test_direct.py (the container)."""

from __future__ import annotations

import os
import subprocess
from dataclasses import replace
from pathlib import Path

from gpulaunch.jobapi import filerecord, leftovers, procid
from gpulaunch.jobapi.view import JobState
from tests.unit.fakes import record_view as _view


def _dead_identity() -> procid.Identity:
    child = subprocess.Popen(["sleep", "60"])
    me = procid.Identity.of(child.pid)
    child.kill()
    child.wait()
    assert me is not None
    return me


def test_the_cgroup_round_trips_in_the_record(tmp_path: Path) -> None:
    base = tmp_path / "state" / "gpulaunch" / "jobs"
    where = Path("/sys/fs/cgroup/gpulaunch-j")
    filerecord.write(_view(JobState.RUNNING), "started", base, cgroup=where)
    found = filerecord.find_record("j", base)
    assert found is not None and found.cgroup == str(where)
    filerecord.write(_view(JobState.RUNNING, job="k"), "started", base)
    other = filerecord.find_record("k", base)
    assert other is not None and other.cgroup is None


def test_only_a_dead_watchers_own_cgroup_is_acted_on(tmp_path: Path) -> None:
    """Never a path a record names outside /sys/fs/cgroup, through a link, under another
    name, of a watcher that lives or of another boot, or of no record cgroup at all."""
    dead = _dead_identity()
    record = filerecord.FileRecord(
        _view(JobState.RUNNING), dead, procid.node_name(), 0.0, str(tmp_path / "gpulaunch-j")
    )
    (tmp_path / "gpulaunch-j").mkdir()
    (tmp_path / "gpulaunch-j" / "cgroup.kill").write_text("")
    assert leftovers.job_cgroup(record) is None  # not under /sys/fs/cgroup
    assert leftovers.end(record) is None
    assert (tmp_path / "gpulaunch-j").is_dir()  # untouched
    for path in (
        "/sys/fs/cgroup/../../tmp/gpulaunch-j",
        "/sys/fs/cgroup/x",
        "relative/gpulaunch-x",
    ):
        assert leftovers.job_cgroup(replace(record, cgroup=path)) is None
    assert leftovers.job_cgroup(replace(record, cgroup=None)) is None
    alive = procid.Identity.of(os.getpid())
    assert alive is not None
    assert leftovers.job_cgroup(replace(record, watcher=alive)) is None
    other_boot = replace(dead, boot="another")
    assert leftovers.job_cgroup(replace(record, watcher=other_boot)) is None
    assert leftovers.job_cgroup(replace(record, node="another-node")) is None


def test_the_lines_say_what_was_seen() -> None:
    ended = leftovers.Ended("j", Path("/sys/fs/cgroup/gpulaunch-j"), 3, True)
    assert "3 process(es) of its ranks were left" in ended.describe()
    assert "killed them (cgroup.kill), its cgroup removed" in ended.describe()
    nothing = leftovers.Ended("j", Path("/sys/fs/cgroup/gpulaunch-j"), 0, True)
    assert nothing.describe().startswith("nothing of job j was left in its cgroup")
