"""Who holds a GPU's lease: the kernel says which process, its note says which job.

The process: /proc/locks lists every flock with the pid that took it and the
inode it is on; the lock file's inode names the GPU. Its user is the owner of
/proc/<pid>, its unit the last component of its cgroup (/proc/<pid>/cgroup):
both the kernel's word, which nobody can fake.

The job: a note the holder writes when its job is planned,
`/run/gpulaunch/holders/<pid>` (a sticky 1777 directory of root's, like /tmp),
`<start time> <job id>`. A note is believed only if it is a regular file (opened
with O_NOFOLLOW) owned by the holder's own user and names the holder's start
time (so a note of an earlier process with the same pid is not). A user can thus
only name their own job, and only a note of a live holder is shown.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from gpulaunch.leases.store import RUN_DIR, lease_dir, lock_name
from gpulaunch.plan.gpus import Gpu

MAX_NOTE = 4096


def holders_dir(root: Path | None = None) -> Path:
    return (root / "run/gpulaunch" if root is not None else RUN_DIR) / "holders"


@dataclass(frozen=True)
class Holder:
    """The process holding one GPU's lease and what is known of it."""

    gpu: Gpu
    pid: int  # 0: not visible from here (another pid namespace)
    user: str
    unit: str
    job: str | None

    def describe(self) -> str:
        if self.user == "?":  # the process that took it is gone: its ranks hold it still
            return (
                f"GPU {self.gpu.index} ({self.gpu.bus_id}): a job whose watcher (pid {self.pid}) "
                "is gone, until its ranks have ended"
            )
        job = self.job if self.job is not None else "?"
        return (
            f"GPU {self.gpu.index} ({self.gpu.bus_id}): job {job}, user {self.user}, "
            f"unit {self.unit}, pid {self.pid}"
        )


def lock_pids(proc: Path = Path("/proc")) -> dict[tuple[int, int, int], int]:
    """(device major, minor, inode) -> pid of each granted FLOCK in /proc/locks."""
    out: dict[tuple[int, int, int], int] = {}
    try:
        text = (proc / "locks").read_text()
    except OSError:
        return out
    for line in text.splitlines():
        parts = line.split()
        # "1: FLOCK  ADVISORY  WRITE 1234 00:1a:5678 0 EOF"; waiters have "->" after "1:"
        if len(parts) < 6 or parts[1] != "FLOCK":
            continue
        try:
            major, minor, inode = parts[5].split(":")
            out[(int(major, 16), int(minor, 16), int(inode))] = int(parts[4])
        except ValueError:
            continue
    return out


def start_time(pid: int, proc: Path = Path("/proc")) -> str | None:
    """A process's start time in clock ticks since boot (/proc/<pid>/stat, field 22)."""
    try:
        text = (proc / str(pid) / "stat").read_text()
    except OSError:
        return None
    fields = text.rpartition(")")[2].split()
    return fields[19] if len(fields) > 19 else None


def _user(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def _unit(pid: int, proc: Path) -> str:
    try:
        text = (proc / str(pid) / "cgroup").read_text()
    except OSError:
        return "?"
    for line in text.splitlines():
        if line.startswith("0::"):
            return line[3:].rstrip("/").rpartition("/")[2] or "none (the root cgroup)"
    return "?"


def read_note(
    pid: int, uid: int, root: Path | None = None, proc: Path = Path("/proc")
) -> str | None:
    """The job a live holder's note names, if the note is believed (see the module)."""
    try:
        fd = os.open(
            holders_dir(root) / str(pid), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
        )
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != uid:
            return None
        text = os.read(fd, MAX_NOTE).decode("utf-8", "replace")
    finally:
        os.close(fd)
    started, _, job = text.partition(" ")
    if started != start_time(pid, proc) or not job.strip():
        return None
    return "".join(c if c.isprintable() else "?" for c in job.strip())


def write_note(job: str, root: Path | None = None) -> Path | None:
    """This process's note naming `job`; None where the holders' directory cannot take it.

    Root makes the directory (sticky 1777). The note is created new (O_EXCL):
    a stale one of ours with this pid is replaced; one of someone else's is left.
    """
    top = holders_dir(root)
    if os.geteuid() == 0:
        top.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
        with contextlib.suppress(FileExistsError):
            os.mkdir(top, 0o755)
            os.chmod(top, 0o1777)
    path = top / str(os.getpid())
    started = start_time(os.getpid())
    if started is None:
        return None
    try:
        dfd = os.open(top, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(dfd)
        if st.st_uid not in (0, os.geteuid()) or st.st_mode & 0o1777 != 0o1777:
            return None
        with contextlib.suppress(FileNotFoundError, PermissionError):
            if os.stat(path.name, dir_fd=dfd, follow_symlinks=False).st_uid == os.geteuid():
                os.unlink(path.name, dir_fd=dfd)
        try:
            fd = os.open(
                path.name,
                os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                0o644,
                dir_fd=dfd,
            )
        except OSError:
            return None
        with os.fdopen(fd, "w") as f:
            f.write(f"{started} {job}")
        return path
    finally:
        os.close(dfd)


def remove_note(path: Path | None) -> None:
    if path is not None:
        with contextlib.suppress(OSError):
            os.unlink(path)


def _held(
    name: str, locks: dict[tuple[int, int, int], int], root: Path | None, proc: Path
) -> tuple[int, str, str, str | None] | None:
    """(pid, user, unit, job) of the holder of the lock file `name`, or None if it is free."""
    try:
        st = os.stat(lease_dir(root) / name, follow_symlinks=False)
    except OSError:
        return None
    pid = locks.get((os.major(st.st_dev), os.minor(st.st_dev), st.st_ino))
    if pid is None:
        return None
    try:
        uid = os.stat(proc / str(pid)).st_uid if pid > 0 else -1
    except OSError:
        uid = -1
    if uid < 0:
        return pid, "?", "?", None
    return pid, _user(uid), _unit(pid, proc), read_note(pid, uid, root, proc)


def holders(
    gpus: Iterable[Gpu], root: Path | None = None, proc: Path = Path("/proc")
) -> list[Holder]:
    """Who holds each of `gpus` that is held now (in the order given)."""
    locks = lock_pids(proc)
    out = []
    for gpu in gpus:
        held = _held(lock_name(gpu), locks, root, proc)
        if held is not None:
            out.append(Holder(gpu, *held))
    return out


def lease_rows(root: Path | None = None, proc: Path = Path("/proc")) -> list[tuple[str, ...]]:
    """`gpulaunch list`: a row per GPU leased now (device, job, user, unit, pid); no GPU
    inventory needed: the lock files say which device each is."""
    try:
        names = sorted(os.listdir(lease_dir(root)), key=lambda n: (len(n), n))
    except OSError:
        return []
    locks = lock_pids(proc)
    rows: list[tuple[str, ...]] = []
    for name in names:
        held = _held(name, locks, root, proc)
        if held is not None:
            pid, user, unit, job = held
            gone = user == "?"
            rows.append(
                (
                    f"/dev/{name}",
                    "(watcher gone, ranks ending)" if gone else job or "?",
                    user,
                    unit,
                    str(pid),
                )
            )
    return rows
