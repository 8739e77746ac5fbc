"""What a machine needs for gpulaunch, and what it has: `gpulaunch setup` and `gpulaunch doctor`."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from gpulaunch import __version__


def add_parsers(
    parser: argparse.ArgumentParser,
    sub: argparse._SubParsersAction[Any],
    manager_options: Callable[[argparse.ArgumentParser, str], None],
) -> None:
    """`gpulaunch --version`, `gpulaunch setup` and `gpulaunch doctor` (with --system/--user)."""
    from gpulaunch.system import doctor, setup

    parser.add_argument("--version", action="version", version=f"gpulaunch {__version__}")
    setup.add_parser(sub)
    doctor.add_parser(sub, manager_options)
