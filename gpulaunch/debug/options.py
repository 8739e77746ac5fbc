"""`start --hang-timeout/--dump-stacks`: the options of gpulaunch/debug/ (cli.py defines `stacks`).

Light on purpose: cli.py imports it for every command.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass


@dataclass(frozen=True)
class HangOptions:
    """`--hang-timeout SECONDS` (None: off) and `--dump-stacks`."""

    hang_timeout: float | None = None
    dump_stacks: bool = False


HANG_TIMEOUT_MIN = 1.0  # less is no hang: a rank is silent that long between two lines


def _timeout(text: str) -> float:
    """A finite number of seconds, at least HANG_TIMEOUT_MIN."""
    try:
        seconds = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not HANG_TIMEOUT_MIN <= seconds < 1e9:
        raise argparse.ArgumentTypeError(
            f"must be at least {HANG_TIMEOUT_MIN:g} second and finite, not {text!r}"
        )
    return seconds


def add_hang_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--hang-timeout",
        type=_timeout,
        metavar="SECONDS",
        help="no output and no CPU use from any rank for this long: take every rank's stacks, "
        "stop the job, exit 124 (needs py-spy: gpulaunch[debug])",
    )
    p.add_argument(
        "--dump-stacks",
        action="store_true",
        help="when a rank fails, take the other ranks' stacks before stopping them (py-spy)",
    )
