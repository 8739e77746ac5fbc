"""Preemption: a notice that the machine goes away is not a failure and not an interrupt.

With `--preempt-grace S`, a SIGTERM to the watcher (or the signals of `--preempt-on`,
e.g. Slurm's `--signal=USR1@120`) means the job is preempted: every running rank gets
`--preempt-signal` (SIGTERM by default) at once and has S seconds, not --grace, to save
its state and exit; what still runs then is killed (SIGKILL), as Slurm's GraceTime does.
A rank knows its grace and the signal from its environment (`rank_environment`), and so
its deadline: S seconds after the signal came; the watcher also writes that deadline
(seconds since the epoch) into the file GPULAUNCH_PREEMPT_DEADLINE_FILE names, before
the signal. The job ends with its own status
(PREEMPTED_STATUS), so that a scheduler requeues it (Slurm: `--requeue` and
`RequeueExit=79`), and a preemption never counts against --max-restarts: it ends the
attempt without a failure.
"""

from __future__ import annotations

import os
import signal as signals
from dataclasses import dataclass
from pathlib import Path
from signal import SIGTERM

GRACE_ENV = "GPULAUNCH_PREEMPT_GRACE"  # seconds from the signal to SIGKILL
SIGNAL_ENV = "GPULAUNCH_PREEMPT_SIGNAL"  # e.g. SIGTERM: the signal that says "preempted"
DEADLINE_FILE_ENV = "GPULAUNCH_PREEMPT_DEADLINE_FILE"  # the deadline, written at the notice
DEADLINE_FILE = "preempt-deadline"


def signal_name(signum: int) -> str:
    """`SIGTERM` for 15 (model.signal_name's, without importing the model: options load light)."""
    try:
        return signals.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


@dataclass(frozen=True)
class PreemptPolicy:
    """`--preempt-grace` (None: a SIGTERM stops the job as ever), `--preempt-signal`,
    `--preempt-on`."""

    grace: float | None = None
    signal: int = SIGTERM  # what the ranks get
    notices: frozenset[int] = frozenset({SIGTERM})  # what the watcher takes for one

    def is_notice(self, signum: int) -> bool:
        """Does `signum`, sent to the watcher, announce a preemption?"""
        return self.grace is not None and signum in self.notices

    def rank_environment(self, directory: Path | None = None) -> dict[str, str]:
        """What each rank is told: the grace, the signal, and where its deadline will be
        written (`directory`: the watcher's own) (nothing without --preempt-grace)."""
        if self.grace is None:
            return {}
        env = {GRACE_ENV: f"{self.grace:g}", SIGNAL_ENV: signal_name(self.signal)}
        if directory is not None:
            env[DEADLINE_FILE_ENV] = str(directory / DEADLINE_FILE)
        return env

    def line(self, signum: int) -> str:
        """The terminal's line when the notice came."""
        return (
            f"gpulaunch: {signal_name(signum)}: preempted; the ranks get "
            f"{signal_name(self.signal)} and {self.grace:g} s (--preempt-grace) to save and exit"
        )


def write_deadline(path: Path, deadline: float) -> bool:
    """`deadline` (seconds since the epoch) into `path`, whole (a rank may read it at any
    moment: written aside, then renamed), never through a link; False if it could not be."""
    aside = path.with_name(path.name + ".new")
    try:
        fd = os.open(aside, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
        with os.fdopen(fd, "w") as out:
            out.write(f"{deadline:.3f}\n")
        os.replace(aside, path)
    except OSError:
        return False
    return True
