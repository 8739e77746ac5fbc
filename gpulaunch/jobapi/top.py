"""`gpulaunch top [JOB]`: every running job's ranks (or one job's), redrawn in place.

The jobs and their ranks come from the bus (gpulaunch/jobapi/client.py) and,
for the direct supervisor's jobs without one (a container, CI), from their record
files (filerecord.py: the caller's own, root's only for root, each believed only
while its very watcher runs); what they use from /proc and their cgroups
(sample.py), the table from view.py. The
table is redrawn every `--interval` seconds: a screen refresh, like top's,
not the watcher's business (the watcher never polls). Off a terminal, or with
`--once`, it prints one table measured over one interval and exits.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from dataclasses import dataclass

from gpulaunch.errors import NoSystemdError, UnknownJobError
from gpulaunch.jobapi import filerecord, whose
from gpulaunch.jobapi.client import JobClient, run
from gpulaunch.jobapi.stepview import STEP_HEADER, step_cells
from gpulaunch.jobapi.targets import targets
from gpulaunch.jobapi.view import JobView, bus_title
from gpulaunch.report import format_table
from gpulaunch.resources.nvml import Gpus, open_gpus
from gpulaunch.resources.sample import JobSample, Sampler
from gpulaunch.resources.view import render


def title(view: JobView) -> str:
    where, held = view.placement()
    return (
        f"job {view.job}: {view.state.value}, {len(view.ranks)} ranks in {where} "
        f"({held}, watcher pid {view.watcher_pid})"
    )


def steps_table(view: JobView) -> str:
    """What its ranks said of their steps (gpulaunch/progress/), below the title; "": none."""
    if not any(r.steps is not None or r.status_text for r in view.ranks):
        return ""
    rows: list[tuple[str, ...]] = [("rank", *STEP_HEADER, "status")]
    rows += [(str(r.rank), *step_cells(r.steps), r.status_text or "-") for r in view.ranks]
    return "\n" + format_table(rows, indent="  ")


@dataclass(frozen=True)
class Jobs:
    """Where `top` looks: the bus (None: no bus answers here) and this node's record files."""

    client: JobClient | None
    where: str

    async def running(self) -> list[JobView]:
        views = [] if self.client is None else await self.client.running()
        listed = {v.job for v in views}
        if whose.other() is None:  # the caller's own records (root: root's); never a user's
            records = filerecord.recent(this_node=True)
            views += [v for v in records if not v.state.ended and v.job not in listed]
        return sorted(views, key=lambda v: v.job)

    async def find(self, job: str) -> JobView | None:
        view = None if self.client is None else await self.client.find(job)
        if view is None and whose.other() is None:
            found = filerecord.find_record(job)
            view = None if found is None or not found.this_node else found.believed()
        return view


class Top:
    """One look at the jobs after another."""

    def __init__(self, jobs: Jobs, job: str | None, sampler: Sampler) -> None:
        self.jobs = jobs
        self.job = job
        self.sampler = sampler
        self.ended = False

    async def views(self) -> list[JobView]:
        if self.job is None:
            return await self.jobs.running()
        view = await self.jobs.find(self.job)
        return [view] if view is not None else []

    async def look(self) -> str:
        views = await self.views()
        if self.job is not None and (not views or views[0].state.ended):
            self.ended = True
        jobs: list[tuple[str, JobSample]] = []
        for view in views:
            ranks, missing = targets(view)
            jobs.append((title(view) + steps_table(view), self.sampler.sample(ranks, missing)))
        where = self.jobs.where
        if not jobs:
            footer = f"no job {self.job!r} on {where}" if self.job else f"no jobs on {where}"
        else:
            footer = time.strftime("%H:%M:%S") + f"  ({where}; Ctrl-C quits)"
        return render(jobs, footer)


HOME_AND_CLEAR = "\x1b[H\x1b[J"  # cursor to the top left, clear to the end: a redraw, as top's


async def _top(jobs: Jobs, args: argparse.Namespace) -> int:
    found = None if args.job is None else await jobs.find(args.job)
    if args.job is not None and (found is None or found.state.ended):
        raise UnknownJobError(
            f"no job {args.job!r} is running on {jobs.where}",
            f"'gpulaunch status {args.job}' shows a job that ended; --system or --user "
            "choose whose jobs",
        )
    gpus = open_gpus()
    top = Top(jobs, args.job, Sampler(gpus))
    try:
        await top.look()  # the first look: CPU % needs two
        if args.once or not os.isatty(sys.stdout.fileno()):
            await asyncio.sleep(args.interval)
            print(await top.look())
            return 0
        while True:
            await asyncio.sleep(args.interval)
            text = await top.look()
            sys.stdout.write(HOME_AND_CLEAR + text + "\n")
            sys.stdout.flush()
            if top.ended:
                return 0
    finally:
        if isinstance(gpus, Gpus):
            gpus.close()


def cmd_top(args: argparse.Namespace) -> int:
    try:
        try:
            return run(args.manager, lambda c: _top(Jobs(c, bus_title(c.manager)), args))
        except NoSystemdError:  # no bus here: the direct supervisor's jobs, from their records
            if whose.other() is not None:  # root for a user: never a record file of theirs
                raise
            where = f"record files in {filerecord.jobs_dir()} (no bus answers here)"
            return asyncio.run(_top(Jobs(None, where), args))
    except KeyboardInterrupt:
        return 0
