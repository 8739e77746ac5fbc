"""A job's record as a file, where neither journald nor a bus can keep it.

Where: root's in `/run/gpulaunch/jobs/` (made and checked as root's, never
from $HOME or $XDG_*: under `sudo -E` those are another user's); an ordinary
user's in `$XDG_STATE_HOME/gpulaunch/jobs/` (default `~/.local/state/...`).
One file per job *and node*, `<label>@<node>.json`: the nodes of a multi-node
job share its id, and $HOME is often on NFS.

What: the journal record's fields (gpulaunch/jobapi/record.py, docs/dbus.md)
as one JSON object, written when the job starts (state `starting`) and again
when it ends, plus the watcher's identity (gpulaunch/jobapi/procid.py: pid, start
time, boot, pid namespace) and its keeper's, where it has one (supervisor/keeper.py:
what ends the job's processes after the watcher; `wait` and `stop` return once both
are gone, so that nothing of the job is left when they do). `gpulaunch status`,
`wait`, `stop`, `signal` and `top` believe a record's "running" only while that
very watcher runs, and act on it through a pidfd opened and checked against the
identity, never on the pid alone.

How, against links planted by someone else: the `gpulaunch` and `jobs`
directories are opened with O_NOFOLLOW and must be ours and writable by us
alone; every file is created, read, replaced and pruned relative to the `jobs`
directory's fd (openat(2) with O_NOFOLLOW, O_EXCL for new files), and a record
is believed only if it is a regular file of ours. Written atomically (a
rename), readable by its owner only.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import select
import stat
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

from gpulaunch.jobapi.procid import Identity, node_name
from gpulaunch.jobapi.record import fields, parse
from gpulaunch.jobapi.view import JobState, JobView, bus_label
from gpulaunch.model import AttemptPhases, Goodput, JobProgress, JobReport, RankProgress
from gpulaunch.parts import Controls, Part
from gpulaunch.report import headline

KEEP = 100  # records kept; the oldest go first
MAX_SIZE = 4 << 20  # a record larger than this is not one of ours
ROOT_DIR = Path("/run/gpulaunch/jobs")
WATCHER_KEY = "_GPULAUNCH_WATCHER"  # the watcher's identity (procid.Identity)
KEEPER_KEY = "_GPULAUNCH_KEEPER"  # its keeper's, if any
NODE_KEY = "_GPULAUNCH_NODE"
SPOOL_SUFFIX = ".logs"  # <record name>.logs/: a detached job's output without journald
CGROUP_KEY = "_GPULAUNCH_CGROUP"  # the direct supervisor's job cgroup (jobapi/leftovers.py)


def jobs_dir(env: dict[str, str] | None = None) -> Path:
    """Where our records are: root's under /run, a user's under their state directory."""
    if os.geteuid() == 0:
        return ROOT_DIR
    env = dict(os.environ) if env is None else env
    base = env.get("XDG_STATE_HOME") or str(Path(env.get("HOME") or "/", ".local", "state"))
    return Path(base, "gpulaunch", "jobs")


def file_name(job: str, node: str | None = None) -> str:
    return f"{bus_label(job)}@{node or node_name()}.json"


def path_of(job: str, base: Path | None = None) -> Path:
    return (base or jobs_dir()) / file_name(job)


@dataclass(frozen=True)
class FileRecord:
    """One record file: the job's view, and which watcher wrote it where."""

    view: JobView
    watcher: Identity | None
    node: str
    mtime: float
    cgroup: str | None = None  # the job's cgroup, where it had one (the writer's word)
    keeper: Identity | None = None

    def watcher_alive(self) -> bool:
        return self.watcher is not None and self.watcher.alive()

    @property
    def this_node(self) -> bool:
        return self.node == node_name()

    def believed(self) -> JobView:
        """The view, unless it says the job runs while its watcher is gone: then `failed`,
        status -1 (nobody knows how it ended). Another node's record (a shared $HOME) is
        its word: nothing here can check it."""
        if self.view.state.ended or not self.this_node or self.watcher_alive():
            return self.view
        return replace(self.view, state=JobState.FAILED, cause=self.lost_cause())

    def lost_cause(self) -> str:
        if self.watcher is not None and not self.watcher.here():
            return "the record is another boot's, another node's or another pid namespace's"
        return "its watcher went away without saying how the job ended (was it killed?)"


# -- the directory, opened without following a link ---------------------------


def _open_dir(base: Path, create: bool) -> int:
    """An fd of `base` (.../gpulaunch/jobs): its last two components ours, not links,
    writable by us alone. OSError if not (FileNotFoundError: not there and not made)."""
    top = base.parent.parent
    if create:
        top.mkdir(parents=True, exist_ok=True, mode=0o755 if os.geteuid() == 0 else 0o700)
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:  # (/run itself may be a sticky 1777 tmpfs in a container: what we make is checked)
        for name, mode in ((base.parent.name, 0o755), (base.name, 0o700)):
            if create:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(name, mode, dir_fd=fd)
            sub = os.open(
                name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd
            )
            os.close(fd)
            fd = sub
            top = top / name
            _check_dir(fd, top, 0o022)
        return fd
    except BaseException:
        os.close(fd)
        raise


def _check_dir(fd: int, where: Path, forbidden: int) -> None:
    st = os.fstat(fd)
    if st.st_uid != os.geteuid() or st.st_mode & forbidden:
        raise PermissionError(
            f"{where} is not a directory of uid {os.geteuid()} that only it may write"
        )


@contextlib.contextmanager
def _directory(base: Path | None, create: bool = False) -> Iterator[int]:
    fd = _open_dir(base or jobs_dir(), create)
    try:
        yield fd
    finally:
        os.close(fd)


directory = _directory  # the records' directory, checked (logs/spool.py keeps spools in it)


# -- writing -------------------------------------------------------------------


def write(
    view: JobView,
    message: str,
    base: Path | None = None,
    cgroup: Path | None = None,
    keeper: int | None = None,
) -> Path:
    """Write (replace) the job's record (`cgroup`: the job's, if it has one; `keeper`: its
    keeper's pid); OSError if it cannot be written."""
    entry = dict(fields(view, message))
    if cgroup is not None:
        entry[CGROUP_KEY] = str(cgroup)
    entry["_UID"] = str(os.getuid())
    entry["__REALTIME_TIMESTAMP"] = str(time.time_ns() // 1000) if view.state.ended else "0"
    for key, pid in ((WATCHER_KEY, view.watcher_pid), (KEEPER_KEY, keeper)):
        me = Identity.of(pid) if pid else None
        if me is not None:
            entry[key] = json.dumps(me.to_json())
    entry[NODE_KEY] = node_name()
    name = file_name(view.job)
    tmp = f".{name}.{os.getpid()}.tmp"
    with _directory(base, create=True) as fd:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp, dir_fd=fd)  # one of a dead process with our pid: never written through
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        out = os.open(tmp, flags, 0o600, dir_fd=fd)
        with os.fdopen(out, "w") as f:
            json.dump(entry, f)
        os.replace(tmp, name, src_dir_fd=fd, dst_dir_fd=fd)
        _prune(fd)
    return (base or jobs_dir()) / name


def _prune(fd: int) -> None:
    """Keep the newest KEEP records (regular files only; links are not followed)."""
    found = []
    for name in os.listdir(fd):
        if not name.endswith(".json"):
            continue
        with contextlib.suppress(OSError):
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            if stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid():
                found.append((st.st_mtime, name))
    for _, old in sorted(found)[:-KEEP]:
        with contextlib.suppress(OSError):
            os.unlink(old, dir_fd=fd)
        remove_spool(fd, old.removesuffix(".json") + SPOOL_SUFFIX)


def remove_spool(fd: int, name: str) -> None:
    """Remove a spool of ours (logs/spool.py) in the records' directory `fd`: its files, then
    itself (a pruned record's spool goes with it); a file or link in its place goes alone."""
    try:
        st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        if st.st_uid != os.geteuid():
            return
        if not stat.S_ISDIR(st.st_mode):
            os.unlink(name, dir_fd=fd)
            return
        sub = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
    except OSError:
        return
    try:
        if os.fstat(sub).st_uid != os.geteuid():
            return
        for entry in os.listdir(sub):
            with contextlib.suppress(OSError):
                os.unlink(entry, dir_fd=sub)
    finally:
        os.close(sub)
    with contextlib.suppress(OSError):
        os.rmdir(name, dir_fd=fd)


# -- reading -------------------------------------------------------------------


def _read(fd: int, name: str) -> FileRecord | None:
    """One record, if it is a regular file of ours (no link followed) that parses."""
    try:
        file = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=fd)
    except OSError:
        return None
    with os.fdopen(file, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_size > MAX_SIZE:
            return None
        try:
            entry = json.loads(f.read(MAX_SIZE))
            view = replace(parse(entry), from_record=True)
        except (OSError, ValueError, TypeError, KeyError):
            return None
    if not isinstance(entry, dict):
        return None
    watcher, keeper = _identity(entry, WATCHER_KEY), _identity(entry, KEEPER_KEY)
    cgroup = entry.get(CGROUP_KEY)
    cgroup = cgroup if isinstance(cgroup, str) else None
    return FileRecord(view, watcher, str(entry.get(NODE_KEY, "")), st.st_mtime, cgroup, keeper)


def _identity(entry: dict[str, object], key: str) -> Identity | None:
    with contextlib.suppress(ValueError, TypeError):
        return Identity.from_json(json.loads(str(entry.get(key, "null"))))
    return None


def find_record(job: str, base: Path | None = None) -> FileRecord | None:
    """This node's record of the job, or None (none, not ours, or not readable)."""
    try:
        with _directory(base) as fd:
            return _read(fd, file_name(job))
    except OSError:
        return None


def find(job: str, base: Path | None = None) -> JobView | None:
    """The job's record as believed (a dead watcher's "running" is not), or None."""
    found = find_record(job, base)
    return None if found is None else found.believed()


def recent_records(base: Path | None = None) -> list[FileRecord]:
    """Every readable record of ours (every node's), newest first."""
    try:
        with _directory(base) as fd:
            names = [n for n in os.listdir(fd) if n.endswith(".json") and not n.startswith(".")]
            found = [r for r in (_read(fd, n) for n in names) if r is not None]
    except OSError:
        return []
    return sorted(found, key=lambda r: -r.mtime)


def recent(base: Path | None = None, this_node: bool = False) -> list[JobView]:
    """Every readable record (`this_node`: of this node only), newest first, as believed."""
    return [r.believed() for r in recent_records(base) if r.this_node or not this_node]


def wait(job: str, base: Path | None = None) -> JobView | None:
    """Sleep until the job's watcher exits, then its keeper, if any (pidfds of those very
    processes: the keeper ends what the ranks left), then the job's record."""
    found = find_record(job, base)
    if found is None or found.view.state.ended or found.watcher is None:
        return None if found is None else found.believed()
    # (a keeper that is PID 1, `exec gpulaunch start` in a container: its end is the pid
    # namespace's, ours too: we return with the watcher's)
    keeper = found.keeper if found.keeper is not None and found.keeper.pid != 1 else None
    for process in (found.watcher, keeper):
        pidfd = None if process is None else process.pidfd()
        if pidfd is not None:
            try:
                select.select([pidfd], [], [])
            finally:
                os.close(pidfd)
    return find(job, base)


def send_signal(record: FileRecord, signum: int) -> bool:
    """Send `signum` to the record's watcher through a checked pidfd; False if it is gone."""
    if record.watcher is None:
        return False
    pidfd = record.watcher.pidfd()
    if pidfd is None:
        return False
    try:
        import signal

        signal.pidfd_send_signal(pidfd, signum)
    except ProcessLookupError:
        return False
    finally:
        os.close(pidfd)
    return True


class FileRecorder(Part):
    """Writes the job's record file at its start and its end; a job `Part`."""

    def __init__(
        self,
        warn: Callable[[str], None],
        base: Path | None = None,
        cgroup: Path | None = None,
        keeper: int | None = None,
        goodput: Callable[[], Goodput | None] = lambda: None,
        phases: Callable[[], tuple[AttemptPhases, ...]] = tuple,
    ) -> None:
        self._goodput = goodput  # the job's so far (progress/timeline.py), at each write
        self._phases = phases  # where each attempt's start went so far (idem)
        self._warn = warn
        self._base = base
        self._cgroup = cgroup  # the direct supervisor's job cgroup (jobapi/leftovers.py)
        self._keeper = keeper  # the watcher's keeper's pid (supervisor/keeper.py), if any

    def _write(self, view: JobView, message: str) -> None:
        try:
            write(view, message, self._base, self._cgroup, self._keeper)
        except OSError as exc:
            self._warn(f"could not write the job's record file: {exc}")

    def attach(self, job: JobProgress, controls: Controls, loop: asyncio.AbstractEventLoop) -> None:
        self._write(JobView.of_progress(job), f"job {job.spec.job} started")

    def changed(self, job: JobProgress, rank: RankProgress | None) -> None:
        if rank is None:  # the job's phase: running, stopping
            view = JobView.of_progress(job, goodput=self._goodput(), phases=self._phases())
            self._write(view, f"job {job.spec.job} {job.phase.value}")

    async def finished(self, job: JobProgress, report: JobReport) -> None:
        self._write(JobView.of_progress(job, report), headline(report).removeprefix("gpulaunch: "))
