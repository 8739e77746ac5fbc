"""What a job's ranks use: CPU, memory, processes, GPU (gpulaunch top, status --resources,
the report's usage columns). Read-only: nothing here changes a process or a unit."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

USE = "each rank's CPU, memory, processes, GPU and last output (measured over 1 s)"


def _interval(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not 0.1 <= value <= 3600:
        raise argparse.ArgumentTypeError(f"not between 0.1 and 3600 seconds: {text!r}")
    return value


def add_top_parser(
    sub: argparse._SubParsersAction[Any],
    manager_options: Callable[[argparse.ArgumentParser], None],
    command: Callable[[argparse.Namespace], int],
) -> None:
    """`gpulaunch top [JOB]` (gpulaunch/resources/top.py)."""
    p = sub.add_parser("top", help="running jobs' ranks live: CPU, memory, GPU, last output")
    p.add_argument("job", metavar="JOB", nargs="?", help="only this job (default: every job)")
    p.add_argument(
        "--interval",
        type=_interval,
        default=2.0,
        metavar="SECONDS",
        help="redraw every SECONDS (default 2; CPU %% is measured over it)",
    )
    p.add_argument(
        "--once", action="store_true", help="print one table and exit (so does a non-terminal)"
    )
    manager_options(p)
    p.set_defaults(func=command)
