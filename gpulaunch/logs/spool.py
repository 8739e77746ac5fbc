"""A detached job's output where no journald keeps it (`gpulaunch start -d` without journald).

Containers and CI often run gpulaunch without systemd: a detached job's ranks then write to
nobody (`--detach` has no terminal), and `gpulaunch logs JOB` found nothing. The watcher
keeps their lines here instead, and `gpulaunch logs` reads them (logs/command.py).

Where: beside the job's record file (jobapi/filerecord.py: root's /run/gpulaunch/jobs, a
user's $XDG_STATE_HOME/gpulaunch/jobs), in `<record name>.logs/`, made and used through
the checked directory's fd (no link followed, files of ours only). One file per rank,
`rank<N>.log`: a line per rank line, `<seq> <time> <o|e> <line>` (seq orders the ranks'
lines among each other), and gpulaunch's own lines (restarts, the report) in `gpulaunch.log`.

Bounded: a rank's file is renamed `rank<N>.log.1` (replacing the one before) when it
reaches ROTATE_AT bytes, so a rank keeps its last 4 to 8 MiB; what went with a replaced
file is counted in `rank<N>.lost` and `gpulaunch logs` says so. `--log-dir` keeps all.

Cleaned with the job: when its record goes (filerecord keeps the newest 100 records and
removes a spool with its record), or when a spool's record is gone altogether (removed by
hand): the next detached job without journald removes such spools. A new job of the same
id starts a new spool. On /run (root's), a reboot clears it too.
"""

from __future__ import annotations

import contextlib
import heapq
import os
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from gpulaunch.jobapi import filerecord

if TYPE_CHECKING:
    from gpulaunch.logs.output import Output

ROTATE_AT = 4 << 20  # bytes of a rank's file before it becomes rank<N>.log.1
OWN = "gpulaunch"  # the file of gpulaunch's own lines
_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC


def without_journald(output: Output, problem: str, detached: str | None) -> str:
    """What to say when journald is not reachable; a detached job (`detached`: its id)
    gets a spool for `gpulaunch logs` (the terminal is nobody's)."""
    if detached is None:
        return (
            f"gpulaunch: warning: journald is not reachable ({problem}); "
            "rank output goes to the terminal and --log-dir only"
        )
    output.spool = Spool(detached)
    return (
        f"gpulaunch: warning: journald is not reachable ({problem}); rank output goes to "
        f"{spool_dir(detached)} for gpulaunch logs (its last 4-8 MiB per rank) and --log-dir"
    )


def spool_name(job: str) -> str:
    """The spool directory's name beside the job's record file."""
    return filerecord.file_name(job).removesuffix(".json") + filerecord.SPOOL_SUFFIX


class Spool:
    """The watcher's side: appends each rank's lines, made at the first line (the record
    file exists by then, so a concurrent start's clean-up does not take it)."""

    def __init__(self, job: str, base: Path | None = None) -> None:
        self.job = job
        self.base = base
        self.fd: int | None = None  # the spool directory
        self.files: dict[str, tuple[int, int]] = {}  # name -> (fd, bytes written)
        self.seq = 0
        self.broken = False  # it could not be written: given up (the report has the rest)

    def _open(self) -> int | None:
        if self.fd is not None or self.broken:
            return self.fd
        name = spool_name(self.job)
        try:
            with filerecord.directory(self.base, create=True) as top:
                prune(top, keep=name)
                filerecord.remove_spool(top, name)  # an earlier job of the same id
                os.mkdir(name, 0o700, dir_fd=top)
                self.fd = os.open(
                    name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=top
                )
        except OSError:
            self.broken = True
        return self.fd

    def _append(self, name: str, data: bytes) -> None:
        fd = self._open()
        if fd is None:
            return
        try:
            if name not in self.files:
                self.files[name] = (os.open(f"{name}.log", _FLAGS, 0o600, dir_fd=fd), 0)
            out, size = self.files[name]
            if size >= ROTATE_AT and name != OWN:
                os.close(out)
                lost = _size(fd, f"{name}.log.1")
                os.replace(f"{name}.log", f"{name}.log.1", src_dir_fd=fd, dst_dir_fd=fd)
                if lost:
                    _add_lost(fd, name, lost)
                out, size = os.open(f"{name}.log", _FLAGS, 0o600, dir_fd=fd), 0
            view = memoryview(data)
            while view:
                view = view[os.write(out, view) :]
            self.files[name] = (out, size + len(data))
        except OSError:  # full, removed: the spool ends here (the terminal was nobody's)
            self.broken = True
            self.close()

    def lines(self, rank: int, stderr: bool, lines: Iterable[bytes]) -> None:
        """A rank's complete lines, as they came (without their newlines)."""
        self.seq += 1
        head = b"%d %.6f %s " % (self.seq, time.time(), b"e" if stderr else b"o")
        self._append(f"rank{rank}", b"".join(head + line + b"\n" for line in lines))

    def message(self, text: str) -> None:
        """A line of gpulaunch's own (a restart, a warning), in its place among the ranks'."""
        self.seq += 1
        head = b"%d %.6f g " % (self.seq, time.time())
        self._append(OWN, b"".join(head + line + b"\n" for line in text.encode().splitlines()))

    def close(self) -> None:
        for out, _ in self.files.values():
            with contextlib.suppress(OSError):
                os.close(out)
        self.files = {}
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def _size(fd: int, name: str) -> int:
    try:
        return os.stat(name, dir_fd=fd, follow_symlinks=False).st_size
    except FileNotFoundError:
        return 0


def _add_lost(fd: int, name: str, lost: int) -> None:
    before = _read_small(fd, f"{name}.lost")
    total = (int(before) if before.isdigit() else 0) + lost
    tmp = f".{name}.lost"
    out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600, dir_fd=fd)
    with os.fdopen(out, "w") as f:
        f.write(str(total))
    os.replace(tmp, f"{name}.lost", src_dir_fd=fd, dst_dir_fd=fd)


def _read_small(fd: int, name: str) -> str:
    try:
        file = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
    except OSError:
        return ""
    with os.fdopen(file) as f:
        return f.read(64).strip()


def prune(top: int, keep: str = "") -> None:
    """Remove the spools in the records' directory `top` whose record file is gone."""
    names = set(os.listdir(top))
    for name in names:
        if not name.endswith(filerecord.SPOOL_SUFFIX) or name == keep:
            continue
        if name.removesuffix(filerecord.SPOOL_SUFFIX) + ".json" in names:
            continue
        filerecord.remove_spool(top, name)


# -- reading (gpulaunch logs) --------------------------------------------------


@dataclass(frozen=True)
class SpoolLine:
    """One line read back: a rank's (rank set) or gpulaunch's own (rank None)."""

    seq: int
    at: float
    rank: int | None
    stderr: bool
    message: bytes


@dataclass(frozen=True)
class SpoolRead:
    lines: list[SpoolLine]
    lost: dict[int, int]  # rank -> bytes of its earliest output not kept


def read(job: str, base: Path | None = None) -> SpoolRead | None:
    """The job's spooled lines in order, or None: it has no spool here."""
    try:
        with filerecord.directory(base) as top:
            fd = os.open(
                spool_name(job),
                os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                dir_fd=top,
            )
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if st.st_uid != os.geteuid():
            return None
        names = os.listdir(fd)
        streams = []
        lost = {}
        for name in sorted(names):
            if name.endswith(".lost") and name.startswith("rank"):
                with contextlib.suppress(ValueError):
                    lost[int(name[4:-5])] = int(_read_small(fd, name))
            if not name.endswith(".log"):
                continue
            who = name.removesuffix(".log")
            rank = int(who[4:]) if who.startswith("rank") and who[4:].isdigit() else None
            if rank is None and who != OWN:
                continue
            chunks = [_read_file(fd, f"{name}.1"), _read_file(fd, name)]
            streams.append(_parse(rank, b"".join(chunks)))
        return SpoolRead(list(heapq.merge(*streams, key=lambda line: line.seq)), lost)
    finally:
        os.close(fd)


def _read_file(fd: int, name: str) -> bytes:
    try:
        file = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=fd)
    except OSError:
        return b""
    with os.fdopen(file, "rb") as f:
        if os.fstat(f.fileno()).st_uid != os.geteuid():
            return b""
        return f.read(2 * ROTATE_AT)  # ours: at most ROTATE_AT and one chunk's lines


def _parse(rank: int | None, data: bytes) -> Iterator[SpoolLine]:
    for raw in data.split(b"\n"):
        parts = raw.split(b" ", 3)
        if len(parts) < 4 or not parts[0].isdigit():
            continue  # a line cut off at the end of a rotated file, or not ours
        try:
            at = float(parts[1])
        except ValueError:
            continue
        yield SpoolLine(int(parts[0]), at, rank, parts[2] == b"e", parts[3])


def remove(job: str, base: Path | None = None) -> None:
    """Remove the job's spool (tests, and a record removed with it)."""
    with contextlib.suppress(OSError), filerecord.directory(base) as top:
        filerecord.remove_spool(top, spool_name(job))


def spool_dir(job: str, base: Path | None = None) -> Path:
    """Where the job's spool is (for messages)."""
    return (base or filerecord.jobs_dir()) / spool_name(job)
