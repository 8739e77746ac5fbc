"""`gpulaunch list | status | stop | wait`: the commands of the job API (docs/dbus.md).

A running job is asked on the bus (its watcher owns `io.gpulaunch.job.<label>`;
jobclient.py); a job that ended is read from its journal record (record.py).
`wait` and `stop` sleep until the job's `Finished` signal, or until its
watcher's name goes away without one (then the record, if any, says how it
ended).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from gpulaunch.errors import JobLostError, NoSystemdError, UnknownJobError
from gpulaunch.jobapi import record
from gpulaunch.jobapi.view import JobView, bus_title
from gpulaunch.model import Manager, format_duration
from gpulaunch.options import add_manager_options, manager_of
from gpulaunch.report import count, format_report, nodes_line
from gpulaunch.units.names import UnitNames

if TYPE_CHECKING:
    from gpulaunch.jobapi.client import JobClient, Outcome

T = TypeVar("T")
RECENT = 20  # records `list --all` shows by default


def _with_client(manager: Manager, work: Callable[[JobClient], Awaitable[T]]) -> T:
    from gpulaunch.jobapi.client import run  # dbus-fast: only when needed

    return run(manager, work)


# -- the commands --------------------------------------------------------------


def add_parsers(sub: Any) -> None:
    """Register list, status, stop and wait on the `gpulaunch` subparsers."""
    p = sub.add_parser("list", help="list running jobs (--all: and recently finished ones)")
    p.add_argument(
        "--all", "-a", action="store_true", help="also show jobs that ended (from the journal)"
    )
    p.add_argument(
        "--limit",
        type=int,
        default=RECENT,
        metavar="N",
        help=f"with --all: how many ended jobs at most (default: {RECENT})",
    )
    _common(p, json_option=True)
    p.set_defaults(func=cmd_list)

    p = sub.add_parser("status", help="a job's ranks and states, or its final report")
    p.add_argument("job", metavar="JOB")
    _common(p, json_option=True)
    p.set_defaults(func=cmd_status)

    p = sub.add_parser("stop", help="stop a job gracefully (its owner or root)")
    p.add_argument("job", metavar="JOB")
    p.add_argument(
        "--no-block", action="store_true", help="return once the stop was accepted, do not wait"
    )
    _common(p)
    p.set_defaults(func=cmd_stop)

    p = sub.add_parser("wait", help="wait until a job ends; exit with its status")
    p.add_argument("job", metavar="JOB")
    _common(p)
    p.set_defaults(func=cmd_wait)


def _common(p: argparse.ArgumentParser, json_option: bool = False) -> None:
    add_manager_options(p)
    if json_option:
        p.add_argument("--json", action="store_true", help="print JSON (for scripts)")


def _unknown(job: str, manager: Manager) -> UnknownJobError:
    return UnknownJobError(
        f"no job {job!r} is running on {bus_title(manager)}, and the journal has no record of it",
        "see 'gpulaunch list --all'; --system or --user choose whose jobs",
    )


def ended_view(job: str, manager: Manager, outcome: Outcome) -> JobView:
    """The final view: from the signal, else the record; errors if there is neither."""
    if outcome.final is not None:
        return outcome.final
    found = record.find(job, manager)
    if found is not None:
        return found
    if not outcome.running:
        raise _unknown(job, manager)
    raise JobLostError(
        f"the watcher of job {job!r} went away without saying how the job ended "
        "(was it killed?); systemd has stopped its ranks",
        f"see journalctl _SYSTEMD_SLICE={UnitNames.for_job(job).job_slice}",
    )


def cmd_list(args: argparse.Namespace) -> int:
    manager = manager_of(args)
    views = _with_client(manager, lambda c: c.running())
    if args.all:
        running = {v.job for v in views}
        views += [v for v in record.recent(manager, args.limit) if v.job not in running]
    if args.json:
        print(json.dumps([v.to_json() for v in views], indent=2))
        return 0
    if not views:
        print(f"gpulaunch: no jobs on {bus_title(manager)}", file=sys.stderr)
        return 0
    rows = [("JOB", "STATE", "RANKS", "STATUS", "SLICE", "ENDED")]
    for v in views:
        rows.append(
            (
                v.job,
                v.state.value,
                str(v.world_size),
                str(v.status) if v.status >= 0 else "-",
                v.slice,
                _when(v.ended_at) if v.ended_at else "-",
            )
        )
    print(_table(rows))
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    manager = manager_of(args)
    unreachable: NoSystemdError | None = None
    try:
        view = _with_client(manager, lambda c: c.find(args.job))
    except NoSystemdError as exc:  # the record may still tell
        view, unreachable = None, exc
    view = view or record.find(args.job, manager)
    if view is None:
        raise unreachable or _unknown(args.job, manager)
    if args.json:
        print(json.dumps(view.to_json(), indent=2))
    elif view.state.ended:
        ended = f", ended {_when(view.ended_at)}" if view.ended_at else ""
        print(format_report(view.report()) + f"\n  ({view.slice}, {view.manager} manager{ended})")
    else:
        print(_live(view))
    return 0


def cmd_stop(args: argparse.Namespace) -> int:
    manager = manager_of(args)
    job = args.job
    try:
        outcome = _with_client(manager, lambda c: c.stop_job(job, block=not args.no_block))
    except KeyboardInterrupt:  # the stop was asked for (or not); the job goes on ending
        return 130
    if outcome is None:
        print(f"gpulaunch: job {job} is stopping", file=sys.stderr)
        return 0
    view = ended_view(job, manager, outcome)
    if not outcome.running:
        print(f"gpulaunch: job {job} is not running; it ended before", file=sys.stderr)
    print(format_report(view.report()), file=sys.stderr)
    return 0


def cmd_wait(args: argparse.Namespace) -> int:
    manager = manager_of(args)
    try:
        outcome = _with_client(manager, lambda c: c.wait(args.job))
    except KeyboardInterrupt:
        return 130
    view = ended_view(args.job, manager, outcome)
    print(format_report(view.report()), file=sys.stderr)
    return view.status


# -- text ----------------------------------------------------------------------


def _when(usec: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(usec / 1e6))


def _table(rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows
    )


def _live(view: JobView) -> str:
    head = (
        f"gpulaunch: job {view.job}: {view.state.value}, {count(len(view.ranks), 'rank')} "
        f"in {view.slice} "
        f"({view.manager} manager, watcher pid {view.watcher_pid}, uid {view.owner})"
    )
    rows = [("rank", "local", "unit", "pid", "state", "exit", "how", "runtime")]
    for r in view.ranks:
        ex = r.result().exit
        ended = r.status >= 0
        rows.append(
            (
                str(r.rank),
                str(r.local_rank),
                r.unit,
                str(r.pid) if r.pid else "-",
                r.state,
                ex.describe() if ended and ex is not None else "-",
                ("stopped" if r.stopped_by_watcher else "exited") if ended else "-",
                format_duration(r.runtime) if ended else "-",
            )
        )
    lines = [head]
    if view.layout is not None:
        lines.append("  " + nodes_line(view.layout))
    if view.node_failure is not None:
        lines.append(f"  the job's first failure: {view.node_failure.describe()}")
    return "\n".join(lines + ["  " + line for line in _table(rows).splitlines()])
