"""What a direct job leaves when its watcher and its keeper die together, ended later.

`pkill -9 -f gpulaunch` (or an OOM kill of both, a container runtime's SIGKILL of the
pair) kills the watcher and its keeper at once: the ranks die by PR_SET_PDEATHSIG, but
what they started (dataloader workers, `subprocess` children, setsid daemons) has nobody
left who could end it (supervisor/keeper.py). Where the job had cgroups (the direct
supervisor's cgroup way), every process of a rank stays in the rank's cgroup whatever it
did, and the kernel ends them all with one write (`cgroup.kill`, Linux 5.14): the next
`gpulaunch start`, `list`, `status`, `wait`, `stop` or `signal` on this machine that
reads the record of a job whose watcher is gone and whose cgroup still has processes ends
them and removes its cgroups (`end`, `sweep`).

Believed only: a record of our own (filerecord.py checks the file and its directory: root
reads root's only), whose watcher was of this boot and pid namespace and is gone, naming a
directory under /sys/fs/cgroup that is no link, is ours (its owner our uid: an ordinary
user cannot make a cgroup root owns), is named as the direct supervisor names a job's
cgroup, and whose `watcher` cgroup is empty (a job that runs has its watcher or keeper
there). The process-group way has no such handle: docs/environments.md says the limit.
"""

from __future__ import annotations

import contextlib
import errno
import os
import select
import stat
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from gpulaunch.base.cgroup import CGROUP_ROOT, procs
from gpulaunch.jobapi.procid import Identity
from gpulaunch.linux import inotify_events, inotify_init, inotify_watch

WAIT_S = 5.0  # for killed processes to leave the cgroups (cgroup.kill is at once; exit is not)
PREFIX = "gpulaunch-"  # the direct supervisor's job cgroup: <own cgroup>/gpulaunch-<JOB>


class _Named(Protocol):
    @property
    def job(self) -> str: ...


class Record(Protocol):
    """What is read of a record file (filerecord.FileRecord; not imported: a short chain)."""

    @property
    def view(self) -> _Named: ...
    @property
    def watcher(self) -> Identity | None: ...
    @property
    def cgroup(self) -> str | None: ...
    @property
    def this_node(self) -> bool: ...


@dataclass(frozen=True)
class Ended:
    """What was found of a dead job in its cgroup, and ended."""

    job: str
    cgroup: Path
    killed: int  # processes that were still in it
    removed: bool  # its cgroups are gone

    def describe(self) -> str:
        gone = "removed" if self.removed else "could not be removed yet"
        if not self.killed:
            return f"nothing of job {self.job} was left in its cgroup {self.cgroup} ({gone})"
        return (
            f"job {self.job}'s watcher and keeper are gone: {self.killed} process(es) of its "
            f"ranks were left in its cgroup {self.cgroup}; killed them (cgroup.kill), its "
            f"cgroup {gone}"
        )


def job_cgroup(found: Record) -> Path | None:
    """The record's job cgroup if it may be acted on: see the module's docstring."""
    if found.cgroup is None or found.watcher is None or not found.this_node:
        return None
    if not found.watcher.here() or found.watcher.alive():
        return None
    path = Path(found.cgroup)
    if not path.is_absolute() or os.path.normpath(path) != str(path) or ".." in path.parts:
        return None
    if not path.name.startswith(PREFIX) or not path.is_relative_to(CGROUP_ROOT):
        return None
    if os.path.realpath(path) != str(path):  # no link anywhere on the way
        return None
    try:
        st = os.lstat(path)
    except OSError:
        return None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
        return None
    if not (path / "cgroup.kill").exists() or _populated(path / "watcher"):
        return None  # not a cgroup2 directory we can end at once, or a job that still runs
    return path


def end(found: Record) -> Ended | None:
    """Kill what a dead job left in its cgroup and remove its cgroups; None: nothing to act
    on (no cgroup, not ours, or its watcher lives)."""
    path = job_cgroup(found)
    if path is None:
        return None
    killed = sum(len(procs(Path(d))) for d, _, _ in os.walk(path))
    if killed:
        with contextlib.suppress(OSError):  # one write: every process below it, at once
            _write(path / "cgroup.kill", "1")
        _wait_empty(path)
    return Ended(found.view.job, path, killed, _remove(path))


def sweep(records: Iterable[Record]) -> list[Ended]:
    """`end` for every record (filerecord.recent_records: ours) whose job left processes."""
    ended = []
    for found in records:
        if found.cgroup is not None:  # (ended too: it may have died before its cleanup)
            done = end(found)
            if done is not None and done.killed:
                ended.append(done)
    return ended


def _populated(cgroup: Path) -> bool:
    try:
        return "populated 1" in (cgroup / "cgroup.events").read_text().splitlines()
    except OSError:
        return False


def _write(path: Path, value: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


def _wait_empty(path: Path) -> None:
    """Until `populated 0` (inotify on cgroup.events, bounded by WAIT_S)."""
    fd = inotify_init()
    try:
        with contextlib.suppress(OSError):
            inotify_watch(fd, str(path / "cgroup.events"))
        deadline = time.monotonic() + WAIT_S
        while _populated(path):
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return
            inotify_events(fd)
    finally:
        os.close(fd)


def _remove(path: Path) -> bool:
    """rmdir its cgroups, deepest first; whether the job's is gone."""
    for d, _, _ in os.walk(path, topdown=False):
        try:
            os.rmdir(d)
        except FileNotFoundError:
            continue
        except OSError as exc:
            if exc.errno not in (errno.EBUSY, errno.ENOTEMPTY):
                raise
    return not path.exists()
