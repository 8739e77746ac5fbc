"""`start --straggler-factor/--straggler-steps`: the options of gpulaunch/progress/.

Light on purpose: options.py imports it for every command.
"""

from __future__ import annotations

import argparse
import math

from gpulaunch.model import StragglerRule

MAX_STEPS = 1_000_000


def _factor(text: str) -> float:
    try:
        factor = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not (math.isfinite(factor) and factor > 1):
        raise argparse.ArgumentTypeError(f"must be a finite number above 1, not {text!r}")
    return factor


def _steps(text: str) -> int:
    try:
        steps = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if not 1 <= steps <= MAX_STEPS:
        raise argparse.ArgumentTypeError(f"must be between 1 and {MAX_STEPS}, not {text}")
    return steps


def add_straggler_options(p: argparse.ArgumentParser) -> None:
    default = StragglerRule()
    p.add_argument(
        "--straggler-factor",
        type=_factor,
        default=default.factor,
        metavar="X",
        help="a rank that reports steps (gpulaunch.progress) is a straggler when its step "
        f"time stays above X times the other ranks' median (default: {default.factor:g})",
    )
    p.add_argument(
        "--straggler-steps",
        type=_steps,
        default=default.steps,
        metavar="N",
        help="... for N of its steps in a row; cleared after N steps at or below "
        f"(default: {default.steps})",
    )


def straggler_rule(args: argparse.Namespace) -> StragglerRule:
    default = StragglerRule()
    return StragglerRule(
        factor=getattr(args, "straggler_factor", default.factor),
        steps=getattr(args, "straggler_steps", default.steps),
    )
