"""`gpulaunch list | status | stop | wait`: the commands of the job API (docs/dbus.md).

A running job is asked on the bus (its watcher owns `io.gpulaunch.job.<label>`;
client.py); a job that ended is read from its journal record (record.py).
Where there is neither bus nor journal (the direct supervisor in a container),
the job's record file says both (filerecord.py).
`wait` and `stop` sleep until the job's `Finished` signal, or until its
watcher's name goes away without one (then the record, if any, says how it
ended).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, TypeVar

from gpulaunch.base.names import UnitNames
from gpulaunch.errors import (
    AccessDeniedError,
    JobLostError,
    NoSystemdError,
    UnavailableError,
    UnknownJobError,
    UsageError,
)
from gpulaunch.jobapi import filerecord, record, whose
from gpulaunch.jobapi.stepview import STEP_HEADER, final_steps, status_lines, step_cells
from gpulaunch.jobapi.view import JobView, bus_title
from gpulaunch.model import Manager, format_duration
from gpulaunch.report import count, format_report, format_table, goodput_lines, nodes_line

if TYPE_CHECKING:
    from gpulaunch.jobapi.client import JobClient, WaitResult
    from gpulaunch.resources.sample import JobSample

T = TypeVar("T")


def _with_client(manager: Manager, work: Callable[[JobClient], Awaitable[T]]) -> T:
    from gpulaunch.jobapi.client import run  # dbus-fast: only when needed

    return run(manager, work)


# -- the commands --------------------------------------------------------------


def final_view(job: str, manager: Manager, outcome: WaitResult) -> JobView:
    """The final view: from the signal, else the record; errors if there is neither."""
    if outcome.final is not None:
        return outcome.final
    found = _record(job, manager)
    if found is not None and found.state.ended:
        return found
    if not outcome.running:
        raise record.unknown_job(job, manager)
    raise JobLostError(
        f"the watcher of job {job!r} went away without saying how the job ended "
        "(was it killed?); systemd has stopped its ranks",
        f"see journalctl _SYSTEMD_SLICE={UnitNames.for_job(job).job_slice}",
    )


def _record(job: str, manager: Manager) -> JobView | None:
    """The job's journal record, else its record file (the direct supervisor's)."""
    try:
        found = record.find(job, manager)
    except UnavailableError:  # no journalctl here
        found = None
    if found is None and whose.other() is None:  # root's own record files only, never a user's
        found = filerecord.find(job)
    return found


def _lost(job: str, found: filerecord.FileRecord | None = None) -> JobLostError:
    if found is not None and found.watcher is not None and not found.watcher.here():
        return JobLostError(
            f"the record of job {job!r} names watcher pid {found.watcher.pid} of another boot "
            "or pid namespace: it cannot be asked here, and it did not say how the job ended",
            f"ask on node {found.node or 'that wrote it'}, or see its --log-dir, if any",
        )
    return JobLostError(
        f"the watcher of job {job!r} went away without saying how the job ended (was it killed?)",
        f"{_left_behind(found)}; see its --log-dir, if any",
    )


def _left_behind(found: filerecord.FileRecord | None) -> str:
    """What is left of a job whose watcher is gone: ended now where its cgroup allows
    (jobapi/leftovers.py); never a cleanup that was not seen."""
    from gpulaunch.jobapi import leftovers

    if found is None:
        return "nothing here can tell what of it is left"
    ended = leftovers.end(found)
    if ended is not None:
        return ended.describe()
    if found.cgroup is not None:
        if not os.path.exists(found.cgroup):
            return f"nothing of it is left: its cgroup {found.cgroup} is gone"
        return f"its keeper may still be ending what is left in its cgroup {found.cgroup}"
    return (
        "if its keeper was killed too, what its ranks started may still run: without a "
        "cgroup nothing can find it (docs/environments.md)"
    )


def _unknown(job: str, manager: Manager, unreachable: NoSystemdError | None) -> UnknownJobError:
    """No such job: on the bus and in the journal, or, without a bus, in the record files."""
    if unreachable is None:
        return record.unknown_job(job, manager)
    return UnknownJobError(
        f"no job {job!r}: no bus answers here ({unreachable.message}) and no record file "
        f"in {filerecord.jobs_dir()} names it",
        "see 'gpulaunch list --all'; a job of the direct supervisor keeps its record there",
    )


def _ended(job: str, view: JobView) -> UnknownJobError:
    when = f" at {_when(view.ended_at)}" if view.ended_at else ""
    return UnknownJobError(
        f"job {job!r} is not running: it ended{when}, {view.state.value} (status {view.status})",
        f"'gpulaunch status {job}' shows how",
    )


def _records(running_only: bool) -> list[JobView]:
    """The direct supervisor's record files, as believed (a dead watcher's job is not running);
    what a dead job left in its cgroup is ended first (jobapi/leftovers.py)."""
    from gpulaunch.jobapi import leftovers

    for ended in leftovers.sweep(filerecord.recent_records()):
        print(f"gpulaunch: {ended.describe()}", file=sys.stderr)
    if running_only:  # what runs here: another node's records cannot be checked from here
        return [v for v in filerecord.recent(this_node=True) if not v.state.ended]
    return filerecord.recent()


def cmd_list(args: argparse.Namespace) -> int:
    manager: Manager = args.manager
    where = bus_title(manager)
    try:
        views = _with_client(manager, lambda c: c.running())
    except NoSystemdError:  # no bus: the direct supervisor's record files still tell
        views = _records(running_only=not args.all)[: args.limit if args.all else None]
        where = f"record files in {filerecord.jobs_dir()} (no bus answers here)"
    else:
        listed = {v.job for v in views}
        for v in _records(running_only=not args.all):  # a direct job without the bus
            if v.job not in listed:
                views.append(v)
                listed.add(v.job)
        if args.all:
            views += [v for v in record.recent(manager, args.limit) if v.job not in listed]
    if args.json:
        print(json.dumps([v.to_json() for v in views], indent=2))
        return 0
    if os.geteuid() == 0 and manager is Manager.SYSTEM:  # root: say that users' jobs run too
        for name in whose.users_with_jobs():
            print(
                f"gpulaunch: {name} runs jobs too: gpulaunch list --user-of {name}", file=sys.stderr
            )
    _print_leases()
    if not views:
        print(f"gpulaunch: no jobs on {where}", file=sys.stderr)
        return 0
    rows = [("JOB", "STATE", "RANKS", "STATUS", "GOODPUT", "SLICE", "ENDED")]
    for v in views:
        rows.append(
            (
                v.job,
                v.state.value,
                str(v.world_size),
                str(v.status) if v.status >= 0 else "-",
                "-" if v.goodput is None else f"{100 * v.goodput.ratio:.1f}%",
                v.slice,
                _when(v.ended_at) if v.ended_at else "-",
            )
        )
    print(format_table(rows))
    return 0


def _print_leases() -> None:
    """Who holds which GPU (`--gpus auto:N`, gpulaunch/leases/): every user's jobs and root's."""
    from gpulaunch.leases.holders import lease_rows

    rows = lease_rows()
    if rows:
        print(format_table([("GPU", "LEASED BY JOB", "USER", "UNIT", "PID"), *rows]))
        print()


def cmd_status(args: argparse.Namespace) -> int:
    manager: Manager = args.manager
    unreachable: NoSystemdError | None = None
    try:
        view = _with_client(manager, lambda c: c.find(args.job))
    except NoSystemdError as exc:  # the record may still tell
        view, unreachable = None, exc
    if view is None:
        try:
            view = record.find(args.job, manager)
        except UnavailableError:  # no journalctl here
            view = None
    if view is None:
        found = filerecord.find_record(args.job)
        if found is None:
            raise _unknown(args.job, manager, unreachable)
        if not found.view.state.ended and not found.watcher_alive():
            raise _lost(args.job, found)
        view = found.view
    sample = None
    if getattr(args, "resources", False) and not view.state.ended:
        sample = _resources(view)
    if args.json:
        out = view.to_json()
        if sample is not None:
            out["resources"] = sample.to_json()
        print(json.dumps(out, indent=2))
    elif view.state.ended:
        ended = f", ended {_when(view.ended_at)}" if view.ended_at else ""
        where, held = view.placement()
        print(format_report(view.report()) + f"\n  ({where}, {held}{ended})")
        for line in final_steps(view.ranks):  # what the ranks said of their steps, if any
            print("  " + line)
        if not view.restarts:  # (the report has it after its restarts)
            print("\n".join("  " + line for line in _goodput(view)))
    else:
        print(_live(view))
        if sample is not None:
            from gpulaunch.resources.view import print_table

            print_table(sample)
    return 0


def _resources(view: JobView) -> JobSample:
    """What each rank of a running job uses, measured over one second."""
    from gpulaunch.jobapi.targets import targets
    from gpulaunch.resources.nvml import Gpus, open_gpus
    from gpulaunch.resources.sample import Sampler, measure

    gpus = open_gpus()
    try:
        return measure(*targets(view), Sampler(gpus), 1.0)
    finally:
        if isinstance(gpus, Gpus):
            gpus.close()


def cmd_stop(args: argparse.Namespace) -> int:
    manager: Manager = args.manager
    job = args.job
    try:
        outcome = _with_client(manager, lambda c: c.stop_job(job, block=not args.no_block))
    except KeyboardInterrupt:  # the stop was asked for (or not); the job goes on ending
        return 130
    except NoSystemdError as exc:  # no bus (a container, CI, a user without one): the record
        if whose.other() is not None:  # root for a user: never a record file of theirs
            raise
        return _stop_by_record(job, manager, block=not args.no_block, unreachable=exc)
    if outcome is not None and outcome.final is None and not outcome.running:
        if whose.other() is None and _live_record(job) is not None:  # a direct job, no API
            return _stop_by_record(job, manager, block=not args.no_block)
    if outcome is None:
        print(f"gpulaunch: job {job} is stopping", file=sys.stderr)
        return 0
    view = final_view(job, manager, outcome)
    if not outcome.running:
        print(f"gpulaunch: job {job} is not running; it ended before", file=sys.stderr)
    print(format_report(view.report()), file=sys.stderr)
    return 0


def _live_record(job: str) -> filerecord.FileRecord | None:
    """This node's record of a job that it says runs (the caller's own records only)."""
    found = filerecord.find_record(job)
    return None if found is None or found.view.state.ended else found


def _stop_by_record(
    job: str, manager: Manager, block: bool, unreachable: NoSystemdError | None = None
) -> int:
    """`stop` without a bus: SIGTERM to the watcher its record file names (its graceful stop,
    as `Stop()` on the bus), through a checked pidfd of that very watcher, then, blocking,
    the record's final report once the watcher and its keeper are gone (nothing left).

    Root reads root's records only (/run/gpulaunch/jobs, checked as root's and written by
    root alone: filerecord.py), never a file under $HOME; an ordinary user their own."""
    import signal

    found = filerecord.find_record(job)
    if found is None:
        raise _unknown(job, manager, unreachable)
    if found.view.state.ended:
        raise _ended(job, found.view)
    try:
        if not filerecord.send_signal(found, signal.SIGTERM):
            raise _lost(job, found)
    except PermissionError:
        raise AccessDeniedError(
            f"not allowed to stop job {job!r}", "only the user who started a job, or root"
        ) from None
    done = filerecord.wait(job) if block else None
    if done is None or not done.state.ended:
        print(f"gpulaunch: job {job} is stopping", file=sys.stderr)
        return 0
    print(format_report(done.report()), file=sys.stderr)
    return 0


def cmd_wait(args: argparse.Namespace) -> int:
    manager: Manager = args.manager
    outcome: WaitResult | None = None
    unreachable: NoSystemdError | None = None
    try:
        try:
            outcome = _with_client(manager, lambda c: c.wait(args.job))
        except NoSystemdError as exc:
            unreachable = exc
        if whose.other() is None and (
            outcome is None or (outcome.final is None and not outcome.running)
        ):  # not on a bus: a direct job's record file may know it
            filerecord.wait(args.job)
            found = filerecord.find_record(args.job)
            if found is not None and not found.view.state.ended:
                raise _lost(args.job, found)
            if found is not None:
                print(format_report(found.view.report()), file=sys.stderr)
                return found.view.status
        if outcome is None:
            raise _unknown(args.job, manager, unreachable)
        view = final_view(args.job, manager, outcome)
    except KeyboardInterrupt:
        return 130
    print(format_report(view.report()), file=sys.stderr)
    return view.status


# -- text ----------------------------------------------------------------------


def _when(usec: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(usec / 1e6))


def _live(view: JobView) -> str:
    where, held = view.placement()
    head = (
        f"gpulaunch: job {view.job}: {view.state.value}, {count(len(view.ranks), 'rank')} "
        f"in {where} ({held}, watcher pid {view.watcher_pid}, uid {view.owner})"
    )
    header = ("rank", "local", "unit", "pid", "state", "exit", "how", "runtime")
    stepping = any(r.steps is not None for r in view.ranks)  # gpulaunch/progress/
    rows: list[tuple[str, ...]] = [header + STEP_HEADER if stepping else header]
    for r in view.ranks:
        ex = r.result().exit
        ended = r.status >= 0
        rows.append(
            (
                str(r.rank),
                str(r.local_rank),
                r.unit or "-",  # no unit: the direct supervisor
                str(r.pid) if r.pid else "-",
                r.state,
                ex.describe() if ended and ex is not None else "-",
                ("stopped" if r.stopped_by_watcher else "exited") if ended else "-",
                format_duration(r.runtime) if ended else _running_for(view, r.pid),
                *(step_cells(r.steps) if stepping else ()),
            )
        )
    lines = [head]
    if view.layout is not None:
        lines.append("  " + nodes_line(view.layout))
    if view.node_failure is not None:
        lines.append(f"  the job's first failure: {view.node_failure.describe()}")
    lines += ["  " + line for line in format_table(rows).splitlines()]
    lines += ["  " + line for line in _goodput(view)]
    return "\n".join(lines + ["  " + line for line in status_lines(view.ranks)])


def _goodput(view: JobView) -> list[str]:
    """Its goodput's lines; none where ranks stepped but no goodput came with them (a record
    or a watcher of an older gpulaunch): "no steps reported" would not be true."""
    if view.goodput is None and any(r.steps is not None for r in view.ranks):
        return []
    return goodput_lines(view.goodput)


def _running_for(view: JobView, pid: int | None) -> str:
    """A running rank's time so far, from its process: a child of the job's watcher here
    (the watcher forks every rank), so never another process's time; "-" if unknown."""
    from gpulaunch.jobapi.procid import running_for

    if not pid or view.state.ended or not view.watcher_pid:
        return "-"
    seconds = running_for(pid, view.watcher_pid)
    return "-" if seconds is None else format_duration(seconds)


def cmd_signal(args: argparse.Namespace) -> int:
    """`gpulaunch signal JOB SIG [--rank N]`: a notice to the ranks (the job goes on), or
    SIGTERM/SIGINT to the job's watcher (it stops the job, as on that signal)."""
    import signal as signals

    manager: Manager = args.manager
    signum = int(args.signal)
    rank = -1 if args.rank is None else args.rank
    name = signals.Signals(signum).name
    stop = signum in (signals.SIGTERM, signals.SIGINT)
    if stop and rank >= 0:
        raise UsageError(
            f"--rank: {name} stops the whole job, not one rank",
            f"leave out --rank, or send a notice (USR1, USR2) to rank {rank}",
        )
    unreachable: NoSystemdError | None = None
    try:
        sent = _with_client(manager, lambda c: c.signal(args.job, signum, rank))
    except NoSystemdError as exc:
        sent, unreachable = None, exc
    if sent is None and whose.other() is not None:
        raise record.unknown_job(args.job, manager)
    if sent is None:  # not on a bus: a direct job's watcher passes a notice on to every rank
        found = filerecord.find_record(args.job)
        if found is None:
            ended = _record(args.job, manager) if unreachable is None else None
            if ended is not None and ended.state.ended:
                raise _ended(args.job, ended)
            raise _unknown(args.job, manager, unreachable)
        if found.view.state.ended:
            raise _ended(args.job, found.view)
        if rank >= 0:
            raise UsageError(
                f"job {args.job!r} has no job API (no bus): --rank needs it",
                "signal every rank (leave out --rank)",
            )
        try:  # through a pidfd of that very watcher: never a pid on the file's word alone
            if not filerecord.send_signal(found, signum):
                raise _lost(args.job, found)
        except PermissionError:
            raise AccessDeniedError(
                f"not allowed to signal job {args.job!r}",
                "only the user who started a job, or root, may signal it",
            ) from None
        sent = found.view.world_size
    if stop:  # the watcher stops the job as on that signal ('gpulaunch wait' tells how)
        print(f"gpulaunch: job {args.job}: {name} sent to its watcher", file=sys.stderr)
        return 0
    print(f"gpulaunch: job {args.job}: {name} sent to {sent} rank(s)", file=sys.stderr)
    return 0
