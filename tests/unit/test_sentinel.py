"""The sentinel (gpulaunch/supervisor/sentinel.py), a real `sh`: at the end of its pipe it
ends the job's cgroup (here a stand-in directory: what it writes is seen in the file), only
where the job's watcher cgroup is empty, and its command line has no word `pkill -f
gpulaunch` would match."""

from __future__ import annotations

import os
import threading
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
    """(a job of the same id started since: its watcher or keeper is there, longer than the
    sentinel waits for a dying watcher to leave it)"""
    _, code = run_sentinel(tmp_path / "gpulaunch-j", populated=1)
    assert code == 0 and not (tmp_path / "gpulaunch-j" / "cgroup.kill").exists()


def test_the_sentinel_waits_for_the_last_to_die_to_leave_the_watcher_cgroup(
    tmp_path: Path,
) -> None:
    """Issue 35 item 11, found by the soak's direct-pkill kind (3 of the ranks' children
    left): the pipe ends as the last of the keeper and the watcher closes its files, before
    the kernel takes it out of its cgroup, so the sentinel's first look can say `populated
    1`. Here cgroup.events is first a FIFO that says so to the first look, then a file that
    says `populated 0` to the next; cgroup.kill is a FIFO this test reads."""
    job = tmp_path / "gpulaunch-j"
    (job / "watcher").mkdir(parents=True)
    events, kill = job / "watcher" / "cgroup.events", job / "cgroup.kill"
    os.mkfifo(events)
    os.mkfifo(kill)
    before = children()
    read_end, fd = os.pipe2(os.O_CLOEXEC)
    spawn_sentinel(read_end)
    (pid,) = children() - before
    tell_sentinel(fd, str(job))
    os.close(fd)
    ended: list[int] = []

    def reap() -> None:  # once the sentinel ended, release a FIFO open that waits for it
        ended.append(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
        for fifo, flags in ((events, os.O_RDONLY), (kill, os.O_WRONLY)):
            try:
                os.close(os.open(fifo, flags | os.O_NONBLOCK))
            except OSError:  # no reader waits there (ENXIO), or it is gone
                pass

    reaper = threading.Thread(target=reap, daemon=True)
    reaper.start()
    # (returns once the sentinel's first look opened it: it reads this and nothing more)
    events.write_text("populated 1\nfrozen 0\n")  # the dying watcher is still there
    events.unlink()
    events.write_text("populated 0\nfrozen 0\n")  # what its next look finds: it left
    said = kill.read_text()  # (released by the reaper if the sentinel ended without a word)
    assert said == "1\n", f"the sentinel gave up at its first look (exit {ended})"
    events.unlink()
    kill.unlink()  # what is left of the stand-in: the sentinel's rmdir can succeed
    reaper.join(timeout=30)
    assert ended == [0] and not job.exists()
