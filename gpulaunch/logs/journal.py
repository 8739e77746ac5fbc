"""Reading the journal: journald's rate limit, lines it kept of a rank, and `gpulaunch logs`.

journald rate-limits per unit and a scope cannot change that
(systemd-facts.md): only journald.conf's `RateLimitBurst=`/`RateLimitIntervalSec=`
can. When a rank wrote more lines than the burst, the watcher compares what
the pump sent with what journald stored and reports the difference.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpulaunch.errors import UnknownJobError
from gpulaunch.model import LogDrop, Manager
from gpulaunch.options import add_manager_options, manager_of
from gpulaunch.units.names import UnitNames

if TYPE_CHECKING:
    from gpulaunch.jobapi.client import JobClient, Outcome

DEFAULT_BURST = 10000  # journald.conf(5), systemd 252
CONF_DIRS = ("/usr/lib/systemd", "/usr/local/lib/systemd", "/run/systemd", "/etc/systemd")
__all__ = ["LogDrop", "add_logs_parser", "rate_limit_burst", "stored_lines", "sync"]


def _conf_files(root: Path) -> list[Path]:
    """journald.conf, then its drop-ins in journald's order (later wins)."""
    main = root / "etc/systemd/journald.conf"
    drop_ins: dict[str, Path] = {}
    for d in CONF_DIRS:
        for f in sorted((root / d.lstrip("/") / "journald.conf.d").glob("*.conf")):
            drop_ins[f.name] = f  # a later directory overrides a file of the same name
    return [main, *(drop_ins[name] for name in sorted(drop_ins))]


def rate_limit_burst(root: Path = Path("/")) -> int | None:
    """journald's configured burst per unit, or None when rate limiting is off."""
    burst, interval = DEFAULT_BURST, "30s"
    for path in _conf_files(root):
        try:
            text = path.read_text()
        except OSError:
            continue
        section = ""
        for raw in text.splitlines():
            line = raw.strip()
            if line.startswith("["):
                section = line
            elif section == "[Journal]" and "=" in line and not line.startswith(("#", ";")):
                key, _, value = (part.strip() for part in line.partition("="))
                if key == "RateLimitBurst" and value.isdigit():
                    burst = int(value)
                elif key == "RateLimitIntervalSec":
                    interval = value
    if burst == 0 or interval.strip() in ("0", "0s", "0ms", "0us"):
        return None
    return burst


def _journalctl(manager: Manager, args: Sequence[str]) -> list[str]:
    unit_flag = ["--user"] if manager is Manager.USER else []
    return ["journalctl", "--no-pager", "-q", *unit_flag, *args]


def sync(manager: Manager) -> None:
    """Have journald store everything it has received (journalctl --sync; root only)."""
    if manager is Manager.SYSTEM and os.geteuid() == 0:
        subprocess.run(["journalctl", "--sync"], capture_output=True, check=False)


def stored_lines(manager: Manager, unit: str, identifier: str) -> int:
    """How many entries of a rank's streams the journal holds."""
    field = "_SYSTEMD_USER_UNIT" if manager is Manager.USER else "_SYSTEMD_UNIT"
    out = subprocess.run(
        _journalctl(
            manager,
            [
                "-o",
                "cat",
                "--output-fields=SYSLOG_IDENTIFIER",
                f"{field}={unit}",
                f"SYSLOG_IDENTIFIER={identifier}",
            ],
        ),
        capture_output=True,
        check=False,
    ).stdout
    return out.count(b"\n")


def rank_units_pattern(job: str, rank: int | None) -> str:
    """A `journalctl -u` name (one rank) or glob (all of a job's ranks).

    journalctl matches globs without backslash escapes, and an escaped job id
    holds no glob characters (names.escape), so the name is used as it is.
    """
    names = UnitNames.for_job(job)
    if rank is not None:
        return names.rank_scope(rank)
    return names.rank_scope(0).removesuffix("0.scope") + "*.scope"


def logs_command(
    manager: Manager,
    job: str,
    rank: int | None = None,
    follow: bool = False,
    since: str | None = None,
    lines: int | None = None,
    after_cursor: str | None = None,
) -> list[str]:
    """The journalctl command behind `gpulaunch logs`.

    Only the ranks' own lines (`_TRANSPORT=stdout`: their pumps' streams), not
    systemd's messages about the units, so that `--lines` counts rank lines.
    Without `lines` it shows every line (`--follow` alone would show the last 10).
    """
    unit_opt = "--user-unit" if manager is Manager.USER else "--unit"
    args = [f"{unit_opt}={rank_units_pattern(job, rank)}", "--all", "-o", "json"]
    if follow:
        args.append("--follow")
    if since:
        args.append(f"--since={since}")
    if after_cursor is not None:
        args.append(f"--after-cursor={after_cursor}")
    else:
        args.append(f"--lines={lines if lines is not None else 'all'}")
    return ["journalctl", "--no-pager", "-q", *args, RANK_LINES]


RANK_LINES = "_TRANSPORT=stdout"  # a journalctl match: what came through a stream


@dataclass(frozen=True)
class LogLine:
    """One rank line read back from the journal."""

    rank: int
    stderr: bool
    message: bytes
    cursor: str = ""


def parse_entry(raw: bytes) -> LogLine | None:
    """A rank line from one line of `journalctl -o json`; None for anything else."""
    try:
        entry = json.loads(raw)
    except ValueError:
        return None
    ident = entry.get("SYSLOG_IDENTIFIER")
    if not isinstance(ident, str) or not ident.startswith("rank") or not ident[4:].isdigit():
        return None
    msg = entry.get("MESSAGE")
    data = bytes(msg) if isinstance(msg, list) else str(msg or "").encode()
    return LogLine(
        rank=int(ident[4:]),
        stderr=entry.get("PRIORITY") == "3",
        message=data,
        cursor=str(entry.get("__CURSOR", "")),
    )


def parse_entries(stream: Iterator[bytes]) -> Iterator[LogLine]:
    """Rank lines from `journalctl -o json` output; systemd's own messages are skipped."""
    for raw in stream:
        line = parse_entry(raw)
        if line is not None:
            yield line


def add_logs_parser(sub: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser("logs", help="show a job's rank output from the journal")
    p.add_argument("job", help="the job id")
    p.add_argument("--rank", type=int, metavar="N", help="only this rank")
    p.add_argument(
        "-f",
        "--follow",
        action="store_true",
        help="keep showing new lines until the job ends; then print its report and exit "
        "with its status, as 'gpulaunch wait'",
    )
    p.add_argument("--since", metavar="TIME", help="only lines since TIME (journalctl --since)")
    p.add_argument(
        "-n", "--lines", type=int, metavar="N", help="only the last N lines (default: all)"
    )
    add_manager_options(p, "logs")
    p.set_defaults(func=cmd_logs)


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
    manager = manager_of(args)
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
    from gpulaunch.jobapi.commands import ended_view
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

    async def work(client: JobClient) -> Outcome:
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
    view = ended_view(args.job, manager, outcome)  # no job and no record: exit 3
    print(format_report(view.report()), file=sys.stderr)
    return view.status


FOLLOW_LINE_MAX = 64 << 20  # one journal entry as JSON: journald's LineMax, escaped


async def _show_lines(stream: asyncio.StreamReader, printer: _Printer) -> None:
    while raw := await stream.readline():
        line = parse_entry(raw)
        if line is not None:
            printer.show(line)
