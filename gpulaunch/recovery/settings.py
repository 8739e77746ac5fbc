"""What the command line asked of recovery (options.py), and the defaults; policy.py
and preempt.py say what they mean, docs/recovery.md why they are the defaults."""

from __future__ import annotations

from dataclasses import dataclass

from gpulaunch.model import REQUEUE_STATUS as REQUEUE_STATUS  # for options.py (light)
from gpulaunch.recovery.classes import FailureClass
from gpulaunch.recovery.preempt import PreemptPolicy
from gpulaunch.recovery.requeue import Requeues

DEFAULT_RESTART_ON = frozenset(
    {FailureClass.EXIT, FailureClass.SIGNAL, FailureClass.HANG, FailureClass.NODE}
)
NO_RESTART_EXIT_CODE = 78  # EX_CONFIG (sysexits.h): "a configuration error", never restarted
CRASH_LOOP_ATTEMPTS = 3  # --crash-loop
PROGRESS_AFTER = 60.0  # --progress-after, seconds


@dataclass(frozen=True)
class RestartPolicy:
    """Which failures restart the gang (`--restart-on`, `--no-restart-exit-code`,
    `--crash-loop`, `--progress-after`); how often is --max-restarts (the spec's)."""

    restart_on: frozenset[FailureClass] = DEFAULT_RESTART_ON
    no_restart_codes: frozenset[int] = frozenset({NO_RESTART_EXIT_CODE})
    crash_loop: int = CRASH_LOOP_ATTEMPTS  # 0: never a crash loop
    progress_after: float = PROGRESS_AFTER

    def says_do_not_restart(self, kind: FailureClass, status: int) -> bool:
        """The script's exit code says "do not restart" (--no-restart-exit-code)."""
        return kind is FailureClass.EXIT and status in self.no_restart_codes

    def restarts(self, kind: FailureClass) -> bool:
        """Failures of this class restart (--restart-on)."""
        return kind in self.restart_on

    def allows(self, kind: FailureClass, status: int) -> bool:
        """Neither rule above refuses a restart of this failure (policy.py's `decide` says
        which one did; multinode/rounds.py asks this for another node's rank)."""
        return self.restarts(kind) and not self.says_do_not_restart(kind, status)

    def start_note(self, max_restarts: int) -> str | None:
        """For the start line: the crash-loop rule can end the job before --max-restarts
        restarts were made (None: it cannot)."""
        if not self.crash_loop or max_restarts < self.crash_loop:
            return None
        return (
            f"up to {max_restarts} restarts (--max-restarts), but {self.crash_loop} attempts in "
            f"a row that fail the same way, each within {self.progress_after:g} s, end it "
            f"sooner (--crash-loop {self.crash_loop}, --progress-after {self.progress_after:g})"
        )


@dataclass(frozen=True)
class RecoveryOptions:
    """Restarts by failure class, preemption and Slurm's requeues, as asked
    (recovery/options.py; the earlier run's state: start.py)."""

    restart: RestartPolicy = RestartPolicy()
    preempt: PreemptPolicy = PreemptPolicy()
    requeue: Requeues = Requeues()
