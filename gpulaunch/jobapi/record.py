"""The durable record of a job: one structured journal entry written when it ends.

Written with the journal's native protocol (a datagram of `FIELD=value` lines
to journald's socket; a sealed memfd when it is too big for a datagram,
systemd's "Native Journal Protocol"), read back with `journalctl -o json`.
Every record carries `MESSAGE_ID=` `MESSAGE_ID` (README, "Job API"), so
`journalctl MESSAGE_ID=<id>` lists every job that ended. docs/dbus.md, "The
journal record", lists the fields; `fields` below writes them and `parse`
reads them back, both from a `JobView` (gpulaunch/jobapi/view.py), the one
shape a job has on the bus, in the record and in `gpulaunch status`.

`_UID` (set by journald, not by us) tells whose job it was.
"""

from __future__ import annotations

import json
import os
import pwd
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from gpulaunch.base.journald import JOURNAL_SOCKET as JOURNAL_SOCKET  # their home
from gpulaunch.base.journald import encode as encode
from gpulaunch.base.journald import send as send
from gpulaunch.base.names import UnitNames
from gpulaunch.base.protocol import RoundEnd
from gpulaunch.errors import UnavailableError, UnknownJobError
from gpulaunch.jobapi import whose
from gpulaunch.jobapi.rankview import RankView, ranks_json
from gpulaunch.jobapi.view import JobState, JobView, bus_title
from gpulaunch.jobapi.wire import node_from_wire, node_wire
from gpulaunch.model import (
    AttemptPhases,
    Carried,
    Cause,
    Goodput,
    GpuUse,
    JobProgress,
    JobReport,
    LogDrop,
    Manager,
    RankProgress,
)
from gpulaunch.parts import Controls, Part
from gpulaunch.report import headline

if TYPE_CHECKING:
    import asyncio


MESSAGE_ID = "74b8d59289c14f16ad639b2abe1d2863"
_PREFIX = "GPULAUNCH_"


# -- writing -------------------------------------------------------------------

# info for a job that succeeded, notice for one someone stopped, err for a failure
_PRIORITY = {JobState.SUCCEEDED: "6", JobState.STOPPED: "5", JobState.FAILED: "3"}


def fields(view: JobView, message: str) -> list[tuple[str, str]]:
    """The journal fields of a finished job's record."""
    out = [
        ("MESSAGE_ID", MESSAGE_ID),
        ("MESSAGE", message),
        ("PRIORITY", _PRIORITY.get(view.state, "3")),
        ("SYSLOG_IDENTIFIER", "gpulaunch"),
        (_PREFIX + "JOB", view.job),
        (_PREFIX + "SLICE", view.slice),
        (_PREFIX + "MANAGER", view.manager),
        (_PREFIX + "STATE", view.state.value),
        (_PREFIX + "STATUS", str(view.status)),
        (_PREFIX + "CAUSE", view.cause),
        (_PREFIX + "WORLD_SIZE", str(view.world_size)),
        (_PREFIX + "WATCHER_PID", str(view.watcher_pid)),
        (_PREFIX + "RANKS", json.dumps([ranks_json(r) for r in view.ranks])),
    ]
    if view.cause_rank >= 0:
        out.append((_PREFIX + "CAUSE_RANK", str(view.cause_rank)))
    if view.node_rank >= 0:
        out.append((_PREFIX + "NODE_RANK", str(view.node_rank)))
        out.append((_PREFIX + "NODES", json.dumps([node_wire(n) for n in view.nodes])))
    if view.cause_what:
        out.append((_PREFIX + "CAUSE_NODE", str(view.cause_node)))
        out.append((_PREFIX + "CAUSE_HOST", view.cause_host))
        out.append((_PREFIX + "CAUSE_WHAT", view.cause_what))
    if view.interrupted_by:
        out.append((_PREFIX + "INTERRUPTED_BY", view.interrupted_by))
    if view.error:
        out.append((_PREFIX + "ERROR", view.error))
    if view.restarts:
        out.append((_PREFIX + "RESTARTS", str(view.restarts)))
    if view.log_drops:  # lines the journal lacks, per rank (so: not in this record's logs)
        out.append((_PREFIX + "LOG_DROPS", json.dumps([d.to_dict() for d in view.log_drops])))
    if view.gpu_use is not None:
        out.append((_PREFIX + "GPU_USE", json.dumps(view.gpu_use.to_dict())))
    if view.goodput is not None:  # ETTR and what failures cost (docs/progress.md, "Goodput")
        out.append((_PREFIX + "GOODPUT", json.dumps(view.goodput.to_dict())))
    if view.phases:  # where each attempt's start went (docs/recovery.md, "Where the time goes")
        out.append((_PREFIX + "PHASES", json.dumps([p.to_dict() for p in view.phases])))
    if view.rounds:  # the attempts of a multi-node job before its last, with their causes
        out.append((_PREFIX + "ROUNDS", json.dumps([r.to_dict() for r in view.rounds])))
    if view.carried is not None:  # a Slurm job's: its next run continues from it
        out.append((_PREFIX + "SLURM_RUNS", json.dumps(view.carried.to_dict())))
    if view.cause_error:
        out.append((_PREFIX + "CAUSE_ERROR", view.cause_error))
        out.append((_PREFIX + "CAUSE_ERROR_SOURCE", view.cause_error_source))
    return out


class Recorder(Part):
    """Writes the job's record when it ends; a job `Part`."""

    def __init__(
        self,
        send: Callable[[bytes], None] = send,
        warn: Callable[[str], None] | None = None,
    ) -> None:
        self._send = send
        self._warn = warn or (lambda text: print(f"gpulaunch: warning: {text}", file=sys.stderr))

    def attach(self, job: JobProgress, controls: Controls, loop: asyncio.AbstractEventLoop) -> None:
        pass

    def changed(self, job: JobProgress, rank: RankProgress | None) -> None:
        pass

    async def finished(self, job: JobProgress, report: JobReport) -> None:
        view = JobView.of_progress(job, report)
        message = headline(report).removeprefix("gpulaunch: ")
        try:
            self._send(encode(fields(view, message)))
        except OSError as exc:
            self._warn(f"could not write the job's record to the journal: {exc.strerror or exc}")


# -- reading -------------------------------------------------------------------


def _text(value: Any) -> str:
    """journalctl's JSON gives a field as a string, an array of bytes, or an array of those."""
    if isinstance(value, list):
        if value and all(isinstance(v, int) for v in value):
            return bytes(value).decode("utf-8", "replace")
        return _text(value[-1]) if value else ""
    return "" if value is None else str(value)


def _int(entry: Mapping[str, Any], key: str, default: int = -1) -> int:
    try:
        return int(_text(entry.get(key)))
    except ValueError:
        return default


def _state(entry: Mapping[str, Any]) -> JobState:
    """The record's state; derived from its cause where it has one (older records
    said `failed` for a job that was stopped)."""
    cause, status = _text(entry.get(_PREFIX + "CAUSE")), _int(entry, _PREFIX + "STATUS")
    if cause in set(Cause):
        return JobState.of_cause(Cause(cause), status)
    return JobState(_text(entry[_PREFIX + "STATE"]))


def parse(entry: Mapping[str, Any]) -> JobView:
    """A record (one object of `journalctl -o json`) as a `JobView`; ValueError if malformed."""
    if _text(entry.get("MESSAGE_ID")) != MESSAGE_ID:
        raise ValueError("not a gpulaunch record")
    try:
        ranks = tuple(RankView.from_json(r) for r in json.loads(_text(entry[_PREFIX + "RANKS"])))
        return JobView(
            job=_text(entry[_PREFIX + "JOB"]),
            slice=_text(entry.get(_PREFIX + "SLICE")),
            manager=_text(entry.get(_PREFIX + "MANAGER")),
            owner=_int(entry, "_UID"),
            watcher_pid=_int(entry, _PREFIX + "WATCHER_PID", 0),
            state=_state(entry),
            world_size=_int(entry, _PREFIX + "WORLD_SIZE", len(ranks)),
            ranks=ranks,
            status=_int(entry, _PREFIX + "STATUS"),
            cause=_text(entry.get(_PREFIX + "CAUSE")),
            cause_rank=_int(entry, _PREFIX + "CAUSE_RANK"),
            error=_text(entry.get(_PREFIX + "ERROR")),
            restarts=_int(entry, _PREFIX + "RESTARTS", 0),
            cause_error=_text(entry.get(_PREFIX + "CAUSE_ERROR")),
            cause_error_source=_text(entry.get(_PREFIX + "CAUSE_ERROR_SOURCE")),
            node_rank=_int(entry, _PREFIX + "NODE_RANK"),
            nodes=tuple(
                node_from_wire(n) for n in json.loads(_text(entry.get(_PREFIX + "NODES")) or "[]")
            ),
            cause_node=_int(entry, _PREFIX + "CAUSE_NODE"),
            cause_host=_text(entry.get(_PREFIX + "CAUSE_HOST")),
            cause_what=_text(entry.get(_PREFIX + "CAUSE_WHAT")),
            interrupted_by=_text(entry.get(_PREFIX + "INTERRUPTED_BY")),
            log_drops=tuple(
                LogDrop(**d) for d in json.loads(_text(entry.get(_PREFIX + "LOG_DROPS")) or "[]")
            ),
            ended_at=_int(entry, "__REALTIME_TIMESTAMP", 0),
            gpu_use=_gpu_use(entry),
            goodput=_goodput(entry),
            phases=tuple(
                AttemptPhases.from_dict(p)
                for p in json.loads(_text(entry.get(_PREFIX + "PHASES")) or "[]")
            ),
            rounds=tuple(
                RoundEnd.from_dict(r)
                for r in json.loads(_text(entry.get(_PREFIX + "ROUNDS")) or "[]")
            ),
            carried=_carried(entry),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"malformed gpulaunch record: {exc!r}") from exc


def _carried(entry: Mapping[str, Any]) -> Carried | None:
    raw = _text(entry.get(_PREFIX + "SLURM_RUNS"))
    return Carried.from_dict(json.loads(raw)) if raw else None


def _gpu_use(entry: Mapping[str, Any]) -> GpuUse | None:
    raw = _text(entry.get(_PREFIX + "GPU_USE"))
    return GpuUse.from_dict(json.loads(raw)) if raw else None


def _goodput(entry: Mapping[str, Any]) -> Goodput | None:
    raw = _text(entry.get(_PREFIX + "GOODPUT"))
    return Goodput.from_dict(json.loads(raw)) if raw else None


def _matches(manager: Manager, job: str | None) -> list[str]:
    """journalctl matches for the records of this manager's jobs that the caller may mean.

    System jobs are root's (`_UID=0`: nobody else can forge one); user jobs the caller's own.
    """
    other = whose.other()
    if manager is Manager.SYSTEM:
        uid = 0
    else:  # root, --user-of: that user's records (root reads every journal file)
        uid = other.uid if other is not None else os.getuid()
    out = [f"MESSAGE_ID={MESSAGE_ID}", f"{_PREFIX}MANAGER={manager.value}", f"_UID={uid}"]
    if job is not None:
        out.append(f"{_PREFIX}JOB={job}")
    return out


def query(matches: Sequence[str], limit: int) -> list[JobView]:
    """The newest `limit` records matching, oldest first (malformed ones skipped)."""
    argv = ["journalctl", "--output=json", "--all", "--no-pager", "--quiet", f"--lines={limit}"]
    try:
        res = subprocess.run(
            [*argv, *matches], capture_output=True, text=True, timeout=60, check=False
        )
    except FileNotFoundError as exc:
        raise UnavailableError(
            "cannot read job records: journalctl not found", "install systemd's journalctl"
        ) from exc
    views = []
    for line in res.stdout.splitlines():
        try:
            views.append(parse(json.loads(line)))
        except ValueError:
            continue
    return views


def find(job: str, manager: Manager) -> JobView | None:
    """The newest record of `job`, or None."""
    views = query(_matches(manager, job), 1)
    return views[-1] if views else None


def recent(manager: Manager, limit: int) -> list[JobView]:
    """The newest record of each of the last `limit` jobs that ended, newest first."""
    seen: dict[str, JobView] = {}
    for view in reversed(query(_matches(manager, None), limit)):
        seen.setdefault(view.job, view)
    return list(seen.values())


# -- a job that ended -----------------------------------------------------------


def unknown_job(job: str, manager: Manager) -> UnknownJobError:
    message = (
        f"no job {job!r} is running on {bus_title(manager)}, and the journal has no record of it"
    )
    hint = "see 'gpulaunch list --all'; --system or --user choose whose jobs"
    if os.geteuid() == 0 and whose.other() is None:
        found = whose.user_of_hint(users_with(job))
        if found is not None:  # root asked about an ordinary user's job: say how to reach it
            return UnknownJobError(message, f"it is a user's job: add {found}")
        hint += ", --user-of USER an ordinary user's (root)"
    return UnknownJobError(message, hint)


def users_with(job: str) -> list[str]:
    """The ordinary users who run a job of this id (cgroupfs), else whose record it has."""
    running = whose.owners_of(UnitNames.for_job(job).job_slice)
    if running:
        return running
    try:
        views = query(
            [f"MESSAGE_ID={MESSAGE_ID}", f"{_PREFIX}MANAGER=user", f"{_PREFIX}JOB={job}"], 1
        )
    except UnavailableError:
        return []
    names = []
    for view in views:
        try:
            names.append(pwd.getpwuid(view.owner).pw_name)
        except KeyError:
            names.append(str(view.owner))
    return names
