"""`gpulaunch stacks JOB [--rank N] [--native]`: every running rank's Python stacks.

The ranks' pids come from the job's watcher on the bus (jobapi/client.py); py-spy
reads each rank (debug/stacks.py), all of them at once.
"""

from __future__ import annotations

import argparse
import asyncio

from gpulaunch.debug.stacks import check_denied, dump_ranks, find_pyspy, format_stacks
from gpulaunch.errors import UnavailableError, UnknownJobError, UsageError
from gpulaunch.jobapi.view import JobView, bus_title
from gpulaunch.model import Manager
from gpulaunch.report import count


def cmd_stacks(args: argparse.Namespace) -> int:
    manager: Manager = args.manager
    pyspy = find_pyspy()  # before anything else: its absence is the likeliest problem
    from gpulaunch.jobapi.client import run  # dbus-fast: only when needed

    view: JobView | None = run(manager, lambda c: c.find(args.job))
    if view is None or view.state.ended:
        raise UnknownJobError(
            f"no job {args.job!r} is running on {bus_title(manager)}",
            "stacks exist only while a job runs: see 'gpulaunch list'; --system or --user "
            "choose whose jobs",
        )
    ranks = [r for r in view.ranks if r.pid > 0 and r.status < 0]
    if args.rank is not None:
        if not any(r.rank == args.rank for r in view.ranks):
            raise UsageError(
                f"job {args.job!r} has no rank {args.rank}",
                f"its ranks are 0-{len(view.ranks) - 1} (on this node)",
            )
        ranks = [r for r in ranks if r.rank == args.rank]
    if not ranks:
        raise UnknownJobError(
            f"job {args.job!r} has no running rank"
            + (f" {args.rank}" if args.rank is not None else ""),
            "see 'gpulaunch status " + args.job + "'",
        )
    stacks = asyncio.run(
        dump_ranks(pyspy, [(r.rank, r.unit, r.pid) for r in ranks], native=args.native)
    )
    check_denied(stacks)
    print("\n\n".join(format_stacks(s) for s in stacks))
    if all(s.error for s in stacks):  # not one rank could be read: say so in the status
        raise UnavailableError(
            f"no stacks of job {args.job!r} could be read ({count(len(stacks), 'rank')} tried)",
            "each rank's line above says why; a rank that just exited has none",
        )
    return 0
