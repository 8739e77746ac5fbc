"""Who holds a GPU's lease: the kernel says which process, its note says which job.

The process: /proc/locks lists every flock with the pid that took it and the
inode it is on; the lock file's inode names the GPU. Its user is the owner of
/proc/<pid>, its unit the last component of its cgroup (/proc/<pid>/cgroup):
both the kernel's word, which nobody can fake.

The process that took a lock may be gone while others keep it (the lock belongs to
the open file, which its children inherit: a SIGKILLed watcher's ranks, or a user
who forked a setsid child to keep a GPU and exited). /proc/locks then shows a dead
pid, or, in a pid namespace, nothing at all. Then the holder is found the way lsof
would: a process with the lock file open whose /proc/<pid>/fdinfo/<fd> lists a
FLOCK on it (proc(5)); root sees every process, a user only their own. What cannot
be seen is named "an unknown process", never left out or left blank.

The job: the holder's note (notes.py), believed only from the holder's own user.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from gpulaunch.leases.notes import read_note
from gpulaunch.leases.store import lease_dir, lock_name
from gpulaunch.plan.gpus import Gpu


@dataclass(frozen=True)
class Holder:
    """The process holding one GPU's lease and what is known of it."""

    gpu: Gpu
    pid: int  # 0: none visible from here
    user: str  # "?" where no process is visible
    unit: str
    job: str | None
    taker: int | None = None  # the pid that took the lock, where it is gone and `pid` kept it

    def describe(self) -> str:
        where = f"GPU {self.gpu.index} ({self.gpu.bus_id}): "
        if self.pid == 0:
            if self.taker is not None:  # e.g. root's ranks, which a user cannot see
                return where + (
                    f"an unknown process (pid {self.taker}, which took it, is gone: a job "
                    "whose watcher is gone holds it until its ranks have ended)"
                )
            return where + "an unknown process (not visible from here)"
        job = self.job if self.job is not None else "?"
        gone = f" (pid {self.taker}, which took it, is gone)" if self.taker is not None else ""
        return f"{where}job {job}, user {self.user}, unit {self.unit}, pid {self.pid}{gone}"


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


def _lock_files(root: Path | None) -> dict[str, tuple[int, int]]:
    """Each lock file's name -> (st_dev, st_ino), not following a link."""
    out: dict[str, tuple[int, int]] = {}
    try:
        names = os.listdir(lease_dir(root))
    except OSError:
        return out
    for name in names:
        with contextlib.suppress(OSError):
            st = os.stat(lease_dir(root) / name, follow_symlinks=False)
            if stat.S_ISREG(st.st_mode):
                out[name] = (st.st_dev, st.st_ino)
    return out


def fd_holders(
    files: dict[str, tuple[int, int]], root: Path | None, proc: Path = Path("/proc")
) -> dict[str, int]:
    """Lock file name -> pid of a process whose open file holds a FLOCK on it.

    Every fd of every process we may read (/proc/<pid>/fd): the link names the file (a
    cheap first filter), stat says it is that inode, fdinfo's `lock:` lines that this
    open file holds a lock on it.
    """
    prefix = str(lease_dir(root).resolve()) + "/"
    wanted = {v: k for k, v in files.items()}
    out: dict[str, int] = {}
    try:
        pids = [p for p in os.listdir(proc) if p.isdigit()]
    except OSError:
        return out
    for pid in pids:
        try:
            fds = os.listdir(proc / pid / "fd")
        except OSError:  # gone, or not ours to read
            continue
        for fd in fds:
            link = proc / pid / "fd" / fd
            try:
                if not os.readlink(link).startswith(prefix):
                    continue
                st = os.stat(link)
                name = wanted.get((st.st_dev, st.st_ino))
                if name is None or name in out:
                    continue
                info = (proc / pid / "fdinfo" / fd).read_text()
            except OSError:
                continue
            if any(
                line.startswith("lock:") and " FLOCK " in line and " WRITE " in line
                for line in info.splitlines()
            ):
                out[name] = int(pid)
    return out


def _owner(pid: int, proc: Path) -> int:
    try:
        return os.stat(proc / str(pid)).st_uid if pid > 0 else -1
    except OSError:
        return -1


class _Sight:
    """What this process can see of the locks now: /proc/locks, then (once, if needed)
    the open files of every process it may read."""

    def __init__(self, root: Path | None, proc: Path, thorough: bool = False) -> None:
        self.root, self.proc = root, proc
        self.thorough = thorough  # look for hidden holders of every lock file (`list`)
        self.locks = lock_pids(proc)
        self.files = _lock_files(root)
        self._by_fd: dict[str, int] | None = None

    def by_fd(self, name: str) -> int | None:
        if self._by_fd is None:
            self._by_fd = fd_holders(self.files, self.root, self.proc)
        return self._by_fd.get(name)

    def held(self, name: str, known_busy: bool) -> tuple[int, str, str, str | None, int | None]:
        """(pid, user, unit, job, taker) of the holder of lock file `name`; pid -1 where it
        is free (or, not `known_busy`, not seen held), pid 0 where the holder is unseen."""
        key = self.files.get(name)
        if key is None:
            return -1, "?", "?", None, None
        taker = self.locks.get((os.major(key[0]), os.minor(key[0]), key[1]))
        if taker is not None and _owner(taker, self.proc) >= 0:
            uid = _owner(taker, self.proc)
            return taker, _user(uid), _unit(taker, self.proc), self._note(taker, uid), None
        gone = taker if taker else None
        if gone is None and not known_busy and not self.thorough:
            return -1, "?", "?", None, None  # not seen held (a start's warning: no scan)
        pid = self.by_fd(name)  # the taker is gone, or hidden from this pid namespace
        if pid is not None and (uid := _owner(pid, self.proc)) >= 0:
            return pid, _user(uid), _unit(pid, self.proc), self._note(pid, uid), gone
        if gone is None and not known_busy:
            return -1, "?", "?", None, None
        return 0, "?", "?", None, gone

    def _note(self, pid: int, uid: int) -> str | None:
        return read_note(pid, uid, self.root, self.proc)


def holders(
    gpus: Iterable[Gpu], root: Path | None = None, proc: Path = Path("/proc"), busy: bool = False
) -> list[Holder]:
    """Who holds each of `gpus` that is held now (in the order given). `busy`: a lock
    attempt found each of them held, so every one gets a holder, "an unknown process"
    where none can be seen."""
    sight = _Sight(root, proc)
    out = []
    for gpu in gpus:
        pid, user, unit, job, taker = sight.held(lock_name(gpu), known_busy=busy)
        if pid >= 0:
            out.append(Holder(gpu, pid, user, unit, job, taker))
    return out


def lease_rows(root: Path | None = None, proc: Path = Path("/proc")) -> list[tuple[str, ...]]:
    """`gpulaunch list`: a row per GPU leased now (device, job, user, unit, pid); no GPU
    inventory needed: the lock files say which device each is. A lock taken by a process
    that is gone, held by one we cannot see, is a row of "?"s with the taker's pid."""
    sight = _Sight(root, proc, thorough=True)
    rows: list[tuple[str, ...]] = []
    for name in sorted(sight.files, key=lambda n: (len(n), n)):
        pid, user, unit, job, taker = sight.held(name, known_busy=False)
        if pid < 0:
            continue
        if pid == 0:
            rows.append(
                (f"/dev/{name}", "(taker gone, held by an unknown process)", "?", "?", str(taker))
            )
        else:
            rows.append((f"/dev/{name}", job or "?", user, unit, str(pid)))
    return rows
