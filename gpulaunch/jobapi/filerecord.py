"""A job's record as a file, where neither journald nor a bus can keep it.

`$XDG_STATE_HOME/gpulaunch/jobs/<label>.json` (default `~/.local/state/...`):
the journal record's fields (gpulaunch/jobapi/record.py, docs/dbus.md) as one
JSON object, written when the job starts (state `starting`, with the watcher's
pid) and again when it ends. `gpulaunch status` and `wait` read it when the
journal and the bus have nothing: `wait` sleeps on the watcher's pidfd, then
reads the final record. Written atomically (a rename), readable by its owner only.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import select
import time
from collections.abc import Callable
from pathlib import Path

from gpulaunch.jobapi.record import fields, parse
from gpulaunch.jobapi.view import JobView, bus_label
from gpulaunch.model import JobProgress, JobReport, RankProgress
from gpulaunch.report import headline

KEEP = 100  # records kept; the oldest go first


def jobs_dir(env: dict[str, str] | None = None) -> Path:
    env = dict(os.environ) if env is None else env
    base = env.get("XDG_STATE_HOME") or str(Path(env.get("HOME") or "/", ".local", "state"))
    return Path(base, "gpulaunch", "jobs")


def path_of(job: str, base: Path | None = None) -> Path:
    return (base or jobs_dir()) / f"{bus_label(job)}.json"


def write(view: JobView, message: str, base: Path | None = None) -> Path:
    """Write (replace) the job's record; OSError if it cannot be written."""
    path = path_of(view.job, base)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    entry = dict(fields(view, message))
    entry["_UID"] = str(os.getuid())
    entry["__REALTIME_TIMESTAMP"] = str(time.time_ns() // 1000) if view.state.ended else "0"
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w") as out:
        json.dump(entry, out)
    os.replace(tmp, path)
    _prune(path.parent)
    return path


def _prune(directory: Path) -> None:
    records = sorted(directory.glob("*.json"), key=lambda p: p.stat().st_mtime)
    for old in records[:-KEEP]:
        with contextlib.suppress(OSError):
            old.unlink()


def find(job: str, base: Path | None = None) -> JobView | None:
    """The job's record, or None (none, or not readable)."""
    try:
        return parse(json.loads(path_of(job, base).read_text()))
    except (OSError, ValueError):
        return None


def recent(base: Path | None = None) -> list[JobView]:
    """Every readable record, newest first."""
    directory = base or jobs_dir()
    views = []
    for path in sorted(directory.glob("*.json"), key=lambda p: -p.stat().st_mtime):
        with contextlib.suppress(OSError, ValueError):
            views.append(parse(json.loads(path.read_text())))
    return views


def wait(job: str, base: Path | None = None) -> JobView | None:
    """Sleep until the job's watcher exits (its pidfd), then its record."""
    view = find(job, base)
    if view is None or view.state.ended or view.watcher_pid <= 0:
        return view
    try:
        pidfd = os.pidfd_open(view.watcher_pid)
    except ProcessLookupError:
        return find(job, base)
    try:
        select.select([pidfd], [], [])
    finally:
        os.close(pidfd)
    return find(job, base)


class FileRecorder:
    """Writes the job's record file at its start and its end; a watcher `Observer`."""

    def __init__(self, warn: Callable[[str], None], base: Path | None = None) -> None:
        self._warn = warn
        self._base = base

    def _write(self, view: JobView, message: str) -> None:
        try:
            write(view, message, self._base)
        except OSError as exc:
            self._warn(f"could not write the job's record file: {exc}")

    def attach(
        self, job: JobProgress, stop: Callable[[], None], loop: asyncio.AbstractEventLoop
    ) -> None:
        self._write(JobView.of_progress(job), f"job {job.spec.job} started")

    def changed(self, job: JobProgress, rank: RankProgress | None) -> None:
        if rank is None:  # the job's phase: running, stopping
            self._write(JobView.of_progress(job), f"job {job.spec.job} {job.phase.value}")

    async def finished(self, job: JobProgress, report: JobReport) -> None:
        self._write(JobView.of_progress(job, report), headline(report).removeprefix("gpulaunch: "))
