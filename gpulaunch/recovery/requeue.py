"""Across Slurm's requeues: the second level of the restart budget, and what runs carry over.

A Slurm job that is requeued runs again from the start of its batch script, with the same
SLURM_JOB_ID and SLURM_RESTART_COUNT one higher. Two things carry over from one run to
the next, through the run's record (its `Carried`, gpulaunch/jobapi/earlier.py reads it):

- the attempt count: the next run's first attempt is numbered after the last one's (its
  ranks' TORCHELASTIC_RESTART_COUNT, the record, the termination message);
- the crash-loop state: the failures in a row that ended the last run, none of them with
  progress, count towards --crash-loop in the next, so that a job that fails the same way
  at once in every run ends with 80 (which no site requeues) instead of running for ever.

The two-level budget (as Megatron's and NVIDIA's resiliency extension's launchers have
it): --max-restarts restarts inside a run; once they are spent, a failure that may be
retried (--restart-on, not a --no-restart-exit-code) ends the run with REQUEUE_STATUS,
"requeue me", while the job was requeued (SLURM_RESTART_COUNT) fewer times than
--max-requeues; after that, the rank's own status as without it. The batch script or
the site (`RequeueExit=79,81`) requeues on it: examples/slurm/.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from gpulaunch.base.slurmruns import REQUEUE_STATUS, Carried

MAX_REQUEUES = 1_000_000  # --max-requeues beyond this is no number of runs


@dataclass(frozen=True)
class Requeues:
    """The job's place among its Slurm runs, and --max-requeues (None: not asked for)."""

    max_requeues: int | None = None
    slurm_job: str | None = None  # SLURM_JOB_ID (None: not in a Slurm job)
    run: int = 0  # SLURM_RESTART_COUNT: requeues before this run
    earlier: Carried | None = None  # what the last run left (start.py reads its record)

    @classmethod
    def of_environment(cls, max_requeues: int | None, env: Mapping[str, str]) -> Requeues:
        job = env.get("SLURM_JOB_ID", "").strip()
        count = env.get("SLURM_RESTART_COUNT", "0").strip()
        return cls(max_requeues, job or None, int(count) if count.isdigit() else 0)

    def with_earlier(self, carried: Carried | None) -> Requeues:
        """With the last run's carried state, if it is this Slurm job's and an earlier run's."""
        if carried is None or carried.slurm_job != self.slurm_job or carried.run >= self.run:
            return self
        return Requeues(self.max_requeues, self.slurm_job, self.run, carried)

    @property
    def left(self) -> bool:
        """May this run end with "requeue me"?"""
        return (
            self.slurm_job is not None
            and self.max_requeues is not None
            and self.run < self.max_requeues
        )

    @property
    def first_attempt(self) -> int:
        """The number of this run's first attempt: after every earlier run's."""
        return self.earlier.attempts if self.earlier is not None else 0

    def line(self, what: str, max_restarts: int) -> str:
        """Why this run ends with REQUEUE_STATUS."""
        assert self.max_requeues is not None
        spent = f"--max-restarts {max_restarts} spent" if max_restarts else "no --max-restarts"
        return (
            f"gpulaunch: {what}; not restarting here ({spent}): exit {REQUEUE_STATUS} for "
            f"Slurm to requeue the job (requeue {self.run + 1} of {self.max_requeues}, "
            "--max-requeues)"
        )

    def carry(self, attempts: int, streak: int, kind: str, status: int) -> Carried | None:
        """What this run hands the next: `attempts` made so far (this run's included), and
        the `streak` of failures in a row (of class `kind`, with `status`) it ended with
        (0 if its last attempt did not fail); None outside Slurm."""
        if self.slurm_job is None:
            return None
        return Carried(self.slurm_job, self.run, attempts, streak, kind, status)
