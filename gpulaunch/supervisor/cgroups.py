"""cgroup v2 files: where we are, whether we may make cgroups there, and the few
operations the direct supervisor needs (Documentation/admin-guide/cgroup-v2.rst).

Only the unified hierarchy: a v1 or hybrid layout has no single cgroup of ours
to write to, and the direct supervisor then uses process groups instead.
"""

from __future__ import annotations

import contextlib
import errno
import os
import select
import signal
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from gpulaunch.base.cgroup import proc_cgroup
from gpulaunch.linux import inotify_events, inotify_init, inotify_watch

CGROUP2_MAGIC = 0x63677270  # statfs(2)'s f_type of cgroup2
MOUNT = Path("/sys/fs/cgroup")


@dataclass(frozen=True)
class Cgroup:
    """One cgroup v2 directory."""

    path: Path

    def child(self, name: str) -> Cgroup:
        return Cgroup(self.path / name)

    def _read(self, name: str) -> str:
        return (self.path / name).read_text()

    def _write(self, name: str, value: str) -> None:
        # One write(2) per value: the kernel takes each write as one request.
        fd = os.open(self.path / name, os.O_WRONLY | os.O_CLOEXEC)
        try:
            os.write(fd, value.encode())
        finally:
            os.close(fd)

    def make(self) -> None:
        """mkdir; FileExistsError if it exists."""
        os.mkdir(self.path)

    def remove(self) -> bool:
        """rmdir; False if it is still populated (or gone already: True)."""
        try:
            os.rmdir(self.path)
        except FileNotFoundError:
            return True
        except OSError as exc:
            if exc.errno in (errno.EBUSY, errno.ENOTEMPTY):
                return False
            raise
        return True

    def add(self, pid: int) -> None:
        """Move `pid` (the whole process) here."""
        self._write("cgroup.procs", str(pid))

    def pids(self) -> list[int]:
        try:
            return [int(line) for line in self._read("cgroup.procs").split()]
        except FileNotFoundError:
            return []

    def populated(self) -> bool:
        """Whether any process is in it or below it (cgroup.events)."""
        try:
            text = self._read("cgroup.events")
        except FileNotFoundError:
            return False
        return "populated 1" in text.splitlines()

    def signal(self, signum: int) -> None:
        """Send `signum` to every process in it, again while new ones appear (forks)."""
        seen: set[int] = set()
        while True:
            fresh = [pid for pid in self.pids() if pid not in seen]
            if not fresh:
                return
            for pid in fresh:
                seen.add(pid)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signum)

    def kill(self) -> None:
        """SIGKILL everything in it at once (cgroup.kill, Linux 5.14); else one by one."""
        try:
            self._write("cgroup.kill", "1")
        except FileNotFoundError:
            if self.path.exists():
                self.signal(signal.SIGKILL)

    def controllers(self) -> set[str]:
        """The controllers its children may use (cgroup.controllers)."""
        return set(self._read("cgroup.controllers").split())

    def enabled(self) -> set[str]:
        """The controllers enabled for its children (cgroup.subtree_control)."""
        return set(self._read("cgroup.subtree_control").split())

    def enable(self, controller: str) -> None:
        """Enable `controller` for its children; OSError when the kernel refuses."""
        if controller not in self.enabled():
            self._write("cgroup.subtree_control", f"+{controller}")

    def disable(self, controller: str) -> None:
        with contextlib.suppress(OSError):
            self._write("cgroup.subtree_control", f"-{controller}")

    def set(self, name: str, value: str) -> None:
        """Write one interface file (memory.max, cpuset.cpus)."""
        self._write(name, value)


def own_cgroup(pid: int | str = "self") -> Cgroup | None:
    """The cgroup v2 directory of `pid`, if the unified hierarchy is mounted at MOUNT."""
    path = proc_cgroup(pid)
    try:
        if path is None or _fs_type(MOUNT) != CGROUP2_MAGIC:
            return None
    except OSError:
        return None
    # In a cgroup namespace the path is relative to its root, which is what the
    # namespace's own mount shows at MOUNT. "/.." : outside our view.
    if path.startswith("/.."):
        return None
    return Cgroup(MOUNT / path.lstrip("/"))


def _fs_type(path: Path) -> int:
    """CGROUP2_MAGIC if `path` is on cgroup2 (os.statvfs lacks f_type: from mountinfo)."""
    best, fstype = "", ""
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        mount_point = left.split()[4]
        inside = str(path) == mount_point or str(path).startswith(mount_point.rstrip("/") + "/")
        if inside and len(mount_point) >= len(best):  # the last, deepest mount wins
            best, fstype = mount_point, right.split()[0]
    return CGROUP2_MAGIC if fstype == "cgroup2" else 0


def writable_cgroup() -> tuple[Cgroup | None, str]:
    """Our own cgroup if we may make cgroups in it and move processes into them, and why not."""
    own = own_cgroup()
    if own is None:
        return None, "no cgroup v2 (unified) hierarchy of ours at /sys/fs/cgroup"
    for name in ("", "cgroup.procs"):
        if not os.access(own.path / name, os.W_OK):
            return None, f"{own.path} is not writable by uid {os.geteuid()}"
    return own, ""


def remove_when_empty(cgroups: Sequence[Cgroup], timeout: float) -> None:
    """rmdir each, waiting (inotify, bounded) for killed processes to leave first."""
    fd = inotify_init()
    try:
        for cgroup in cgroups:
            with contextlib.suppress(OSError):
                inotify_watch(fd, str(cgroup.path / "cgroup.events"))
        deadline = time.monotonic() + timeout
        while not all(c.remove() for c in cgroups):
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return
            inotify_events(fd)
    finally:
        os.close(fd)
