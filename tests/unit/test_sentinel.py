"""The sentinel (gpulaunch/supervisor/sentinel.py), a real `sh`: at the end of its pipe it
ends the job's cgroup (here a stand-in directory: what it writes is seen in the file), only
where the job's watcher cgroup is empty, and its command line has no word `pkill -f
gpulaunch` would match."""

from __future__ import annotations

import os
from pathlib import Path

from gpulaunch.supervisor.sentinel import spawn_sentinel, tell_sentinel


def children() -> set[int]:
    found: set[int] = set()
    for task in Path("/proc/self/task").iterdir():
        found.update(int(p) for p in (task / "children").read_text().split())
    return found


def run_sentinel(job: Path, populated: int) -> tuple[str, int]:
    """The job's stand-in cgroup told, the pipe closed: the sentinel's command line and its
    exit status, once it ended."""
    (job / "watcher").mkdir(parents=True)
    (job / "watcher" / "cgroup.events").write_text(f"populated {populated}\nfrozen 0\n")
    before = children()
    read_end, fd = os.pipe2(os.O_CLOEXEC)
    spawn_sentinel(read_end)
    (pid,) = children() - before
    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode()
    tell_sentinel(fd, str(job))
    os.close(fd)  # as the deaths of the keeper and the watcher do
    status = os.waitpid(pid, 0)[1]
    return cmdline, os.waitstatus_to_exitcode(status)


def test_the_sentinel_ends_the_cgroup_when_its_pipe_ends(tmp_path: Path) -> None:
    cmdline, _ = run_sentinel(tmp_path / "gpulaunch-j", populated=0)
    assert (tmp_path / "gpulaunch-j" / "cgroup.kill").read_text() == "1\n"
    assert "gpulaunch" not in cmdline and "gpulaunch-j" not in cmdline, cmdline


def test_the_sentinel_leaves_a_job_whose_watcher_cgroup_is_populated(tmp_path: Path) -> None:
    """(a job of the same id started since: its watcher or keeper is there)"""
    _, code = run_sentinel(tmp_path / "gpulaunch-j", populated=1)
    assert code == 0 and not (tmp_path / "gpulaunch-j" / "cgroup.kill").exists()
