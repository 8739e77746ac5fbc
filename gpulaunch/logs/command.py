"""`gpulaunch logs JOB`: the job's rank lines from the journal, with rank prefixes.

`-f` follows them (journalctl --follow as a child) until the job ends, then
prints the report and exits with the job's status, as `gpulaunch wait` does.
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from gpulaunch.errors import UnknownJobError
from gpulaunch.logs.journal import (
    RANK_LINES,
    LogLine,
    logs_command,
    parse_entries,
    parse_entry,
    sync,
)
from gpulaunch.model import Manager

if TYPE_CHECKING:
    from gpulaunch.jobapi.client import JobClient, WaitResult


class _Printer:
    """Writes rank lines with their prefixes and remembers the last one's cursor."""

    def __init__(self) -> None:
        self.width = 1
        self.cursor: str | None = None

    def show(self, line: LogLine) -> None:
        self.width = max(self.width, len(str(line.rank)))
        out = sys.stderr.buffer if line.stderr else sys.stdout.buffer
        out.write(f"[{line.rank:>{self.width}}] ".encode() + line.message + b"\n")
        out.flush()
        if line.cursor:
            self.cursor = line.cursor

    def run(self, argv: Sequence[str]) -> None:
        """Show what a (non-following) journalctl prints."""
        with subprocess.Popen(argv, stdout=subprocess.PIPE) as proc:
            assert proc.stdout is not None
            for line in parse_entries(iter(proc.stdout.readline, b"")):
                self.show(line)


def _unknown(args: argparse.Namespace) -> UnknownJobError:
    what = f"rank {args.rank} of job" if args.rank is not None else "job"
    return UnknownJobError(
        f"no logs of {what} {args.job!r} in the journal",
        "check the job id (gpulaunch list --all), and --user/--system",
    )


def cmd_logs(args: argparse.Namespace) -> int:
    """`gpulaunch logs`: journalctl for the job's rank units, with rank prefixes."""
    manager: Manager = args.manager
    printer = _Printer()
    try:
        if args.follow:
            return _follow(manager, args, printer)
        argv = logs_command(manager, args.job, args.rank, False, args.since, args.lines)
        probe = [*argv[:-1], "-o", "cat", "--lines=1", RANK_LINES]
        if not subprocess.run(probe, capture_output=True, check=False).stdout:
            raise _unknown(args)
        printer.run(argv)
    except BrokenPipeError:
        sys.stderr.close()  # nobody reads on: say nothing more
    return 0


def _follow(manager: Manager, args: argparse.Namespace, printer: _Printer) -> int:
    """Show the job's lines so far, then new ones until the job ends; exit as `wait`.

    Event-driven: a `journalctl --follow` child brings new lines while the job
    client sleeps until the job's `Finished` (or its watcher leaving the bus).
    Then the follower is stopped and whatever the journal got after its last
    line is shown, so the end of the job is shown whole.
    """
    from gpulaunch.jobapi.client import run
    from gpulaunch.jobapi.commands import final_view
    from gpulaunch.report import format_report

    def command(follow: bool) -> list[str]:
        first = printer.cursor is None
        return logs_command(
            manager,
            args.job,
            args.rank,
            follow,
            args.since,
            args.lines if first else None,
            after_cursor=printer.cursor,
        )

    async def work(client: JobClient) -> WaitResult:
        printer.run(command(follow=False))  # what is there: -n counts in it
        follower = await asyncio.create_subprocess_exec(
            *command(follow=True), stdout=asyncio.subprocess.PIPE, limit=FOLLOW_LINE_MAX
        )
        assert follower.stdout is not None
        reader = asyncio.create_task(_show_lines(follower.stdout, printer))
        try:
            return await client.wait(args.job)
        finally:
            if follower.returncode is None:
                follower.terminate()
            await follower.wait()
            await reader

    try:
        outcome = run(manager, work)
    except KeyboardInterrupt:
        return 130
    sync(manager)  # what journald read is in the journal
    printer.run(command(follow=False))  # the rest, after the last line shown
    view = final_view(args.job, manager, outcome)  # no job and no record: exit 3
    print(format_report(view.report()), file=sys.stderr)
    return view.status


FOLLOW_LINE_MAX = 64 << 20  # one journal entry as JSON: journald's LineMax, escaped


async def _show_lines(stream: asyncio.StreamReader, printer: _Printer) -> None:
    while raw := await stream.readline():
        line = parse_entry(raw)
        if line is not None:
            printer.show(line)
