"""The command line of restarts by failure class and of preemption (`start`, `render`).

Light on purpose: cli.py imports it for every command. docs/recovery.md has the
user's side; the defaults are policy.py's and preempt.py's.
"""

from __future__ import annotations

import argparse
import math
import os
import signal
from collections.abc import Callable

from gpulaunch.errors import UsageError
from gpulaunch.recovery.classes import FailureClass, parse_classes
from gpulaunch.recovery.preempt import PreemptPolicy, signal_name
from gpulaunch.recovery.requeue import MAX_REQUEUES, Requeues
from gpulaunch.recovery.settings import (
    CRASH_LOOP_ATTEMPTS,
    DEFAULT_RESTART_ON,
    NO_RESTART_EXIT_CODE,
    PROGRESS_AFTER,
    REQUEUE_STATUS,
    RecoveryOptions,
    RestartPolicy,
)

# The signals the watcher hears at all (gpulaunch/base/interrupts.py): a notice can be
# one of them only.
NOTICE_SIGNALS = frozenset(
    {signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2}
)
SECONDS_MAX = 1e9  # as --grace (plan/spec.py): any longer is "never"


def parse_signal(text: str) -> int:
    """`TERM`, `SIGTERM`, `sigusr1` or `15` → the number; ValueError if it is none."""
    word = text.strip().upper()
    if word.isdigit():
        number = int(word)
        if number in {s.value for s in signal.Signals}:
            return number
        raise ValueError(f"no signal has the number {number}")
    name = word if word.startswith("SIG") else "SIG" + word
    try:
        return signal.Signals[name].value
    except KeyError:
        raise ValueError(f"unknown signal {text!r}") from None


def _argtype(parse: Callable[[str], object], hint: str) -> Callable[[str], object]:
    def convert(text: str) -> object:
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"{exc}; {hint}") from None

    return convert


def _codes(text: str) -> frozenset[int]:
    codes = set()
    for word in (w.strip() for w in text.split(",")):
        if not word.isdigit() or not 1 <= int(word) <= 255:
            raise ValueError(f"not an exit code from 1 to 255: {word!r}")
        codes.add(int(word))
    return frozenset(codes)


def _crash_loop(text: str) -> int:
    if not text.isdigit() or int(text) == 1 or int(text) > 1_000_000:
        raise ValueError(f"{text!r} is not 0 (never) or a number of attempts from 2")
    return int(text)


def _requeues(text: str) -> int:
    if not text.isdigit() or int(text) > MAX_REQUEUES:
        raise ValueError(f"{text!r} is not a number of requeues from 0")
    return int(text)


def _seconds(text: str) -> float:
    try:
        seconds = float(text)
    except ValueError:
        raise ValueError(f"not a number of seconds: {text!r}") from None
    if not (0 < seconds <= SECONDS_MAX and math.isfinite(seconds)):
        raise ValueError(f"must be more than 0 and at most {SECONDS_MAX:.0f} seconds, not {text}")
    return seconds


def _signals(text: str) -> frozenset[int]:
    found = frozenset(parse_signal(w) for w in text.split(",") if w.strip())
    outside = sorted(signal_name(s) for s in found - NOTICE_SIGNALS)
    if not found or outside:
        raise ValueError(
            f"the watcher does not take {', '.join(outside)} as a notice" if outside else "empty"
        )
    return found


def add_recovery_options(p: argparse.ArgumentParser) -> None:
    """`--restart-on`, `--no-restart-exit-code`, `--crash-loop`, `--progress-after`,
    `--max-requeues`, `--preempt-grace`, `--preempt-signal`, `--preempt-on`."""
    g = p.add_argument_group("restarts and preemption (see docs/recovery.md)")
    default_classes = ",".join(sorted(DEFAULT_RESTART_ON))
    g.add_argument(
        "--restart-on",
        type=_argtype(parse_classes, f"give some of {', '.join(FailureClass)}, or all, or none"),
        metavar="CLASS[,CLASS]",
        help="with --max-restarts: the failures that restart the ranks: exit (a non-zero exit "
        "code), signal, oom (an OOM kill), hang (--hang-timeout), node (another node failed), "
        f"all, none (default: {default_classes})",
    )
    g.add_argument(
        "--no-restart-exit-code",
        action="append",
        type=_argtype(_codes, "e.g. --no-restart-exit-code 3 or 3,4"),
        default=[],
        metavar="N[,N]",
        help="a rank that exits with N ends the job at once, never restarted (always: "
        f"{NO_RESTART_EXIT_CODE}, EX_CONFIG, a configuration error)",
    )
    g.add_argument(
        "--crash-loop",
        type=_argtype(_crash_loop, "e.g. --crash-loop 3, or 0 for never"),
        default=CRASH_LOOP_ATTEMPTS,
        metavar="K",
        help="K attempts in a row that fail the same way, none of them running "
        "--progress-after, end the job (status 80; 0: never; default: "
        f"{CRASH_LOOP_ATTEMPTS})",
    )
    g.add_argument(
        "--progress-after",
        type=_argtype(_seconds, "e.g. --progress-after 60"),
        default=PROGRESS_AFTER,
        metavar="SECONDS",
        help="an attempt that ran this long made progress: it is no crash loop "
        f"(default: {PROGRESS_AFTER:g})",
    )
    g.add_argument(
        "--max-requeues",
        type=_argtype(_requeues, "e.g. --max-requeues 3"),
        metavar="N",
        help="in a Slurm job (sbatch --requeue): once --max-restarts are spent, a failure that "
        f"would restart ends the run with {REQUEUE_STATUS} ('requeue me') while the job was "
        "requeued fewer than N times (SLURM_RESTART_COUNT); attempts and crash loops count "
        "across the runs (examples/slurm/)",
    )
    g.add_argument(
        "--preempt-grace",
        type=_argtype(_seconds, "e.g. --preempt-grace 120"),
        metavar="SECONDS",
        help="a SIGTERM to gpulaunch (or --preempt-on) is a preemption: the ranks get "
        "--preempt-signal and SECONDS (not --grace) to save and exit, then SIGKILL; the job "
        "exits 79, for a scheduler to requeue it",
    )
    g.add_argument(
        "--preempt-signal",
        type=_argtype(parse_signal, "e.g. --preempt-signal USR1"),
        metavar="SIGNAL",
        help="what the ranks get when the job is preempted (default: TERM)",
    )
    g.add_argument(
        "--preempt-on",
        type=_argtype(_signals, "give some of TERM, INT, HUP, USR1, USR2"),
        metavar="SIGNAL[,SIGNAL]",
        help="the signals to gpulaunch that mean a preemption, with --preempt-grace "
        "(default: TERM; Slurm's --signal=USR1@120: USR1)",
    )


def recovery_options(args: argparse.Namespace) -> RecoveryOptions:
    """The parsed options, checked together."""
    if args.preempt_grace is None:
        given = [o for o, v in (("--preempt-signal", args.preempt_signal),
                                ("--preempt-on", args.preempt_on)) if v is not None]  # fmt: skip
        if given:
            raise UsageError(
                f"{given[0]} needs --preempt-grace", "add --preempt-grace SECONDS, e.g. 120"
            )
    if args.preempt_signal in (signal.SIGKILL, signal.SIGSTOP):
        raise UsageError(
            f"--preempt-signal {signal_name(args.preempt_signal)} cannot be caught: no rank "
            "could save anything",
            "use TERM, USR1 or another signal the ranks handle",
        )
    codes = frozenset({NO_RESTART_EXIT_CODE}).union(*args.no_restart_exit_code)
    restart = RestartPolicy(
        restart_on=DEFAULT_RESTART_ON if args.restart_on is None else args.restart_on,
        no_restart_codes=codes,
        crash_loop=args.crash_loop,
        progress_after=args.progress_after,
    )
    preempt = PreemptPolicy(
        grace=args.preempt_grace,
        signal=signal.SIGTERM if args.preempt_signal is None else args.preempt_signal,
        notices=frozenset({signal.SIGTERM}) if args.preempt_on is None else args.preempt_on,
    )
    requeue = Requeues.of_environment(args.max_requeues, os.environ)
    if args.max_requeues is not None and requeue.slurm_job is None:
        raise UsageError(
            f"--max-requeues {args.max_requeues}: not in a Slurm job (no SLURM_JOB_ID), and "
            "nothing else requeues a job",
            "leave it out here (--max-restarts restarts inside the job), or run the job "
            "under sbatch --requeue",
        )
    return RecoveryOptions(restart, preempt, requeue)
