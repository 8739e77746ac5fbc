"""Command-line options that several subcommands share."""

from __future__ import annotations

import argparse
import os

from gpulaunch.model import Manager


def add_manager_options(p: argparse.ArgumentParser, what: str = "jobs") -> None:
    """`--system` / `--user`: which systemd manager (and bus) the command is about."""
    group = p.add_mutually_exclusive_group()
    group.add_argument(
        "--system",
        dest="manager",
        action="store_const",
        const=Manager.SYSTEM,
        help=f"{what} of the system manager (system bus; default as root)",
    )
    group.add_argument(
        "--user",
        dest="manager",
        action="store_const",
        const=Manager.USER,
        help=f"{what} of your user manager (session bus; default for other users)",
    )


def manager_of(args: argparse.Namespace) -> Manager:
    """The manager asked for, else root's system manager or a user's own."""
    if args.manager is not None:
        return Manager(args.manager)
    return Manager.SYSTEM if os.geteuid() == 0 else Manager.USER
