"""Which process a pid meant: a pid, its start time, the boot and the pid namespace.

A pid written to a file may be nobody's by the time it is read, someone else's
(reused), one of another boot, or of another pid namespace (a container). A
process is the one recorded only if all four match; `pidfd()` opens a pidfd and
checks the start time *after* opening it, so that what it refers to cannot
change under the caller (signal and wait through it, never through the pid).
"""

from __future__ import annotations

import contextlib
import os
import socket
from dataclasses import dataclass
from pathlib import Path


def boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def pid_namespace() -> int:
    """The inode of our pid namespace (0 where it cannot be read)."""
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0


def node_name() -> str:
    """This machine's name as the record files use it (no '/', never empty)."""
    name = socket.gethostname().replace("/", "_").strip(".") or "localhost"
    return name[:64]


def start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (/proc/PID/stat, field 22);
    None if it is gone or a zombie (it ended)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return None if fields[0] in ("Z", "X") else int(fields[19])
    except (OSError, IndexError, ValueError):
        return None


def running_for(pid: int, parent: int) -> float | None:
    """Seconds since the process started (proc(5): its start time in clock ticks since
    boot, and /proc/uptime), if it runs here as a child of `parent`; else None."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        start = None if fields[0] in ("Z", "X") or int(fields[1]) != parent else int(fields[19])
    except (OSError, IndexError, ValueError):
        return None
    if start is None:
        return None
    try:
        uptime = float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, IndexError, ValueError):
        return None
    return max(0.0, uptime - start / os.sysconf("SC_CLK_TCK"))


@dataclass(frozen=True)
class Identity:
    """One process, told apart from any other that ever had or will have its pid."""

    pid: int
    start: int
    boot: str
    pidns: int

    @classmethod
    def of(cls, pid: int) -> Identity | None:
        start = start_time(pid)
        if start is None:
            return None
        return cls(pid, start, boot_id(), pid_namespace())

    def to_json(self) -> dict[str, object]:
        return {"pid": self.pid, "start": self.start, "boot": self.boot, "pidns": self.pidns}

    @classmethod
    def from_json(cls, data: object) -> Identity | None:
        if not isinstance(data, dict):
            return None
        try:
            return cls(int(data["pid"]), int(data["start"]), str(data["boot"]), int(data["pidns"]))
        except (KeyError, TypeError, ValueError):
            return None

    def here(self) -> bool:
        """Whether its pid means anything here: this boot, this pid namespace."""
        return self.pid > 0 and self.boot == boot_id() and self.pidns == pid_namespace()

    def pidfd(self) -> int | None:
        """A pidfd of this very process if it still runs here, else None."""
        if not self.here():
            return None
        try:
            fd = os.pidfd_open(self.pid)
        except OSError:
            return None
        if start_time(self.pid) != self.start:  # the pid was reused before we opened it
            os.close(fd)
            return None
        return fd

    def alive(self) -> bool:
        fd = self.pidfd()
        if fd is None:
            return False
        with contextlib.suppress(OSError):
            os.close(fd)
        return True
