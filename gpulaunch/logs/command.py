"""`gpulaunch logs JOB`: the job's rank lines from the journal, with rank prefixes.

`-f` follows them (journalctl --follow as a child) until the job ends, then
prints the report and exits with the job's status, as `gpulaunch wait` does.

A detached job that ran without journald kept its lines in a spool (logs/spool.py):
read from there, `-f` shows what is there, waits for the job's end (its record's
watcher, through a pidfd) and shows the rest. A restarted job's attempts are told
apart: a line between them (`attempt_line`), where systemd started the rank scopes again.
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from gpulaunch.errors import UnknownJobError, UsageError
from gpulaunch.logs.journal import (
    RANK_LINES,
    LogLine,
    attempt_starts,
    logs_command,
    parse_entries,
    parse_entry,
    sync,
)
from gpulaunch.model import Manager

if TYPE_CHECKING:
    from gpulaunch.jobapi.client import JobClient, WaitResult
    from gpulaunch.logs import spool as spool_types


def attempt_line(attempt: int) -> bytes:
    """The line between a restarted job's attempts (attempt 0: the first, no line before)."""
    return b"-- attempt %d (restart %d) --" % (attempt + 1, attempt)


class _Printer:
    """Writes rank lines with their prefixes and remembers the last one's cursor.

    Attempts: `starts` are when each attempt after the first began (journal.attempt_starts);
    a line past the next one is preceded by that attempt's line. Following (`refresh`), a
    rank line from a log pump not seen before may belong to an attempt begun since: the
    starts are read again then."""

    def __init__(self, starts: Callable[[], list[int]] = list, follow: bool = False) -> None:
        self.width = 1
        self.cursor: str | None = None
        self.refresh = starts
        self.starts = starts()
        self.follow = follow
        self.pumps: dict[int, int] = {}  # rank -> the pid of its last line's pump
        self.attempt = 0
        self.shown = False  # a rank line was shown

    def _attempts(self, line: LogLine) -> None:
        if self.follow and line.pid and self.pumps.get(line.rank, line.pid) != line.pid:
            self.starts = self.refresh()
        self.pumps[line.rank] = line.pid
        first = not self.shown
        self.shown = True
        while self.attempt < len(self.starts) and line.at >= self.starts[self.attempt]:
            self.attempt += 1
            passed = self.attempt < len(self.starts) and line.at >= self.starts[self.attempt]
            if not (first and passed):  # the first line shown: only its own attempt's line
                sys.stdout.buffer.write(attempt_line(self.attempt) + b"\n")

    def finish(self) -> None:
        """The attempts begun after the last line shown (no line of theirs, or none of the
        rank asked for)."""
        if not self.shown:
            return
        self.starts = self.refresh() if self.follow else self.starts
        while self.attempt < len(self.starts):
            self.attempt += 1
            sys.stdout.buffer.write(attempt_line(self.attempt) + b"\n")
        sys.stdout.flush()

    def show(self, line: LogLine) -> None:
        self._attempts(line)
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
        spooled = _from_spool(args, printer)
        if spooled is not None:
            return spooled
        printer = _Printer(lambda: attempt_starts(manager, args.job), args.follow)
        if args.follow:
            return _follow(manager, args, printer)
        argv = logs_command(manager, args.job, args.rank, False, args.since, args.lines)
        probe = [*argv[:-1], "-o", "cat", "--lines=1", RANK_LINES]
        try:
            found = subprocess.run(probe, capture_output=True, check=False).stdout
        except OSError:  # no journalctl here
            found = b""
        if not found:
            raise _unknown(args)
        printer.run(argv)
        printer.finish()
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
    printer.finish()
    view = final_view(args.job, manager, outcome)  # no job and no record: exit 3
    print(format_report(view.report()), file=sys.stderr)
    return view.status


FOLLOW_LINE_MAX = 64 << 20  # one journal entry as JSON: journald's LineMax, escaped


async def _show_lines(stream: asyncio.StreamReader, printer: _Printer) -> None:
    while raw := await stream.readline():
        line = parse_entry(raw)
        if line is not None:
            printer.show(line)


def _from_spool(args: argparse.Namespace, printer: _Printer) -> int | None:
    """The job's lines from its spool (a detached job without journald), or None: no spool.

    `--lines` counts rank lines; gpulaunch's own lines (a restart) are shown in their place,
    on stderr. `-f`: then the job's end (its record file's watcher) and the rest."""
    from gpulaunch.logs import spool

    read = spool.read(args.job)
    if read is None:
        return None
    if args.since:
        raise UsageError(
            f"--since needs the journal: job {args.job!r} ran without journald",
            f"its lines are in {spool.spool_dir(args.job)}; use --lines N",
        )
    for rank, lost in sorted(read.lost.items()):
        if args.rank is None or args.rank == rank:
            print(
                f"gpulaunch: rank {rank}'s first {lost:,} bytes of output are not kept (a job "
                f"without journald keeps the last {spool.ROTATE_AT >> 20}-"
                f"{2 * spool.ROTATE_AT >> 20} MiB per rank; --log-dir keeps all)",
                file=sys.stderr,
            )
    lines = [x for x in read.lines if x.rank is None or args.rank in (None, x.rank)]
    if args.lines is not None:
        ranks = [i for i, x in enumerate(lines) if x.rank is not None]
        first = ranks[-args.lines] if 0 < args.lines <= len(ranks) else 0
        lines = lines[first:] if args.lines > 0 else []
    last = _show_spooled(lines, printer)
    if not args.follow:
        return 0
    from gpulaunch.jobapi import filerecord
    from gpulaunch.report import format_report

    try:
        view = filerecord.wait(args.job)  # its watcher's end (a pidfd), or the record now
    except KeyboardInterrupt:
        return 130
    rest = spool.read(args.job)
    if rest is not None:
        more = [x for x in rest.lines if x.seq > last]
        _show_spooled([x for x in more if x.rank is None or args.rank in (None, x.rank)], printer)
    if view is None or not view.state.ended:
        return 0
    print(format_report(view.report()), file=sys.stderr)
    return view.status


def _show_spooled(lines: Sequence[spool_types.SpoolLine], printer: _Printer) -> int:
    """Show spooled lines; the last one's sequence number (0: none)."""
    last = 0
    for x in lines:
        if x.rank is None:
            sys.stdout.flush()
            sys.stderr.buffer.write(x.message + b"\n")
            sys.stderr.flush()
        else:
            printer.show(LogLine(rank=x.rank, stderr=x.stderr, message=x.message))
        last = x.seq
    return last
