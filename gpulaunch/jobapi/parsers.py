"""The command line of the job API: list, status, stop, wait, signal (jobapi/commands.py)
and logs (logs/journal.py); gpulaunch/cli.py adds them to `gpulaunch`."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

RECENT = 20  # records `list --all` shows by default


def _notice(text: str) -> int:
    """SIGUSR1 or SIGUSR2, by name (with or without SIG) or number."""
    import signal

    name = text.upper().removeprefix("SIG")
    for notice in (signal.SIGUSR1, signal.SIGUSR2):
        if name in (notice.name.removeprefix("SIG"), str(int(notice))):
            return int(notice)
    raise argparse.ArgumentTypeError(
        f"{text!r} is not a notice: USR1 or USR2 (stop a job with 'gpulaunch stop')"
    )


def add_parsers(
    sub: Any,
    add_manager_options: Callable[[argparse.ArgumentParser, str], None],
    command: Callable[[str, str], Callable[[argparse.Namespace], int]],
) -> None:
    """list, status, stop, wait (gpulaunch/jobapi/commands.py) and logs (logs/journal.py)."""
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
    add_manager_options(p, "jobs")
    p.add_argument("--json", action="store_true", help="print JSON (for scripts)")
    p.set_defaults(func=command("jobapi.commands", "cmd_list"))

    p = sub.add_parser("status", help="a job's ranks and states, or its final report")
    p.add_argument("job", metavar="JOB")
    add_manager_options(p, "jobs")
    p.add_argument("--json", action="store_true", help="print JSON (for scripts)")
    p.set_defaults(func=command("jobapi.commands", "cmd_status"))

    p = sub.add_parser("stop", help="stop a job gracefully (its owner or root)")
    p.add_argument("job", metavar="JOB")
    p.add_argument(
        "--no-block", action="store_true", help="return once the stop was accepted, do not wait"
    )
    add_manager_options(p, "jobs")
    p.set_defaults(func=command("jobapi.commands", "cmd_stop"))

    p = sub.add_parser("wait", help="wait until a job ends; exit with its status")
    p.add_argument("job", metavar="JOB")
    add_manager_options(p, "jobs")
    p.set_defaults(func=command("jobapi.commands", "cmd_wait"))

    p = sub.add_parser(
        "signal", help="pass SIGUSR1 or SIGUSR2 on to a job's ranks; the job goes on"
    )
    p.add_argument("job", metavar="JOB")
    p.add_argument("signal", type=_notice, metavar="SIG", help="USR1 or USR2 (SIGUSR1, 10, ...)")
    p.add_argument("--rank", type=int, metavar="N", help="only this (global) rank")
    add_manager_options(p, "jobs")
    p.set_defaults(func=command("jobapi.commands", "cmd_signal"))

    p = sub.add_parser("logs", help="show a job's rank output from the journal")
    p.add_argument("job", help="the job id")
    p.add_argument("--rank", type=int, metavar="N", help="only this rank")
    p.add_argument("-f", "--follow", action="store_true", help="keep showing new lines")
    p.add_argument("--since", metavar="TIME", help="only lines since TIME (journalctl --since)")
    p.add_argument("-n", "--lines", type=int, metavar="N", help="only the last N lines")
    add_manager_options(p, "logs")
    p.set_defaults(func=command("logs.journal", "cmd_logs"))
