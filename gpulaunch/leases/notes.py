"""Holders' notes: which job a lease's holder runs, written by the holder, read for refusals.

The kernel names the process that holds a GPU (holders.py); the job id is only in the
holder's own memory, so it writes `<start time> <job id>` into a note named for its pid:

- root's jobs: `/run/gpulaunch/holders/<pid>`, a directory of root's (0755) that only
  root writes;
- an ordinary user's jobs: `/run/user/<uid>/gpulaunch/holders/<pid>`, inside the user's own
  runtime directory (logind makes it 0700 on a tmpfs of its own, sized by
  `RuntimeDirectorySize=`), so whatever a user writes there is bounded by their own
  tmpfs, never by /run's inodes. No directory of /run is shared and writable by others
  (issue 35: a 1777 directory there let one user fill /run for everyone). Without a
  runtime directory at /run/user/<uid> (no logind) a user's job writes no note and its
  holder is shown with job `?`.

Reading: every component is opened relative to the one before with O_NOFOLLOW and must
belong to the holder's own user (root's for root's); the note must be a regular file of
that user, opened without blocking, at most MAX_NOTE bytes, and name the holder's start
time (a note of an earlier process with the same pid is not believed). A user can thus
only name their own job, and only a note of a live holder is shown. Root can read every
user's note; an ordinary user only their own and root's (another user's runtime
directory is closed to them).
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

MAX_NOTE = 4096
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def notes_dir(uid: int, root: Path | None = None) -> Path:
    """Where the notes of `uid`'s holders live (under a test's fake machine root if given)."""
    base = root if root is not None else Path("/")
    if uid == 0:
        return base / "run/gpulaunch/holders"
    return base / f"run/user/{uid}/gpulaunch/holders"


def start_time(pid: int, proc: Path = Path("/proc")) -> str | None:
    """A process's start time in clock ticks since boot (/proc/<pid>/stat, field 22)."""
    try:
        text = (proc / str(pid) / "stat").read_text()
    except OSError:
        return None
    fields = text.rpartition(")")[2].split()
    return fields[19] if len(fields) > 19 else None


def _trusted_start(uid: int, root: Path | None) -> tuple[Path, list[str]]:
    """The directory from which on everything must be the holder's (below root's /run, or
    /run/user), and the components below it."""
    top = notes_dir(uid, root)
    if uid == 0:
        return top.parent.parent, ["gpulaunch", "holders"]
    return top.parent.parent.parent, [str(uid), "gpulaunch", "holders"]


def _open_notes(uid: int, root: Path | None, make: bool) -> int | None:
    """An fd of `uid`'s notes directory, every component `uid`'s and not a link; None if not.

    With `make`, the last components (never /run/user/<uid> itself) are made where missing.
    A notes directory of root's that others may write (one an older gpulaunch made 1777)
    is believed by nobody, and closed to others again by root's next note.
    """
    start, parts = _trusted_start(uid, root)
    try:
        fd = os.open(start, _DIR)
    except OSError:
        return None
    try:
        for i, name in enumerate(parts):
            if make and (uid == 0 or i > 0):
                with contextlib.suppress(FileExistsError):
                    os.mkdir(name, 0o700 if uid and name == "holders" else 0o755, dir_fd=fd)
            sub = os.open(name, _DIR, dir_fd=fd)
            os.close(fd)
            fd = sub
            st = os.fstat(fd)
            if st.st_uid != uid:
                os.close(fd)
                return None
            if uid == 0 and st.st_mode & 0o022:
                if not make:
                    os.close(fd)
                    return None
                os.fchmod(fd, 0o755)
        return fd
    except OSError:
        os.close(fd)
        return None


def read_note(
    pid: int, uid: int, root: Path | None = None, proc: Path = Path("/proc")
) -> str | None:
    """The job a live holder's note names, if the note is believed (see the module)."""
    dfd = _open_notes(uid, root, make=False)
    if dfd is None:
        return None
    try:
        fd = os.open(
            str(pid),
            os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY,
            dir_fd=dfd,
        )
    except OSError:
        return None
    finally:
        os.close(dfd)
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
    """This process's note naming `job`; None where it has nowhere to go (see the module).

    The note is created new (O_EXCL): a stale one of ours with this pid is replaced.
    """
    uid = os.geteuid()
    started = start_time(os.getpid())
    if started is None:
        return None
    if uid == 0:
        notes_dir(0, root).parent.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
    dfd = _open_notes(uid, root, make=True)
    if dfd is None:
        return None
    name = str(os.getpid())
    try:
        _prune(dfd)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name, dir_fd=dfd)  # a stale note of ours: the directory is ours alone
        try:
            fd = os.open(
                name,
                os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                0o644,
                dir_fd=dfd,
            )
        except OSError:
            return None
        with os.fdopen(fd, "w") as f:
            f.write(f"{started} {job}")
        return notes_dir(uid, root) / name
    finally:
        os.close(dfd)


def _prune(dfd: int) -> None:
    """Remove the notes of holders that are gone (a SIGKILLed watcher's): those whose pid
    no longer runs with the start time the note names. The directory is the writer's own."""
    for entry in os.listdir(dfd):
        try:
            fd = os.open(entry, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dfd)
        except OSError:
            continue
        try:
            started = os.read(fd, 64).split(b" ", 1)[0].decode("ascii", "replace")
        except OSError:
            continue
        finally:
            os.close(fd)
        now = start_time(int(entry)) if entry.isdigit() else None
        if now is None or (started and started != now):  # (empty: being written now)
            with contextlib.suppress(OSError):
                os.unlink(entry, dir_fd=dfd)


def remove_note(path: Path | None) -> None:
    if path is not None:
        with contextlib.suppress(OSError):
            os.unlink(path)
