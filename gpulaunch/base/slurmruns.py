"""What a run of a Slurm job hands the next one after a requeue, and the "requeue me" status.

Data only: gpulaunch/recovery/requeue.py says what it means, the job's record keeps it
(`GPULAUNCH_SLURM_RUNS`), gpulaunch/jobapi/earlier.py reads it back.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

REQUEUE_STATUS = 81  # "requeue me" (--max-requeues; gpulaunch/errors.py's table)


@dataclass(frozen=True)
class Carried:
    """What a run of a Slurm job hands the next run of the same job, after a requeue, in
    its record (gpulaunch/recovery/requeue.py): how many attempts the runs so far made, and
    the failures in a row that ended them (the crash-loop rule's input)."""

    slurm_job: str  # SLURM_JOB_ID
    run: int  # the run's SLURM_RESTART_COUNT (0: the first run)
    attempts: int  # attempts of this run and every one before it
    streak: int = 0  # its last attempts that failed the same way, none making progress
    streak_class: str = ""  # their failure class (recovery/classes.py) and status
    streak_status: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Carried:
        """ValueError (or TypeError) if it is not one."""
        carried = cls(
            slurm_job=str(data["slurm_job"]),
            run=int(data["run"]),
            attempts=int(data["attempts"]),
            streak=int(data.get("streak", 0)),
            streak_class=str(data.get("streak_class", "")),
            streak_status=int(data.get("streak_status", 0)),
        )
        if min(carried.run, carried.attempts, carried.streak) < 0:
            raise ValueError(f"negative counts in {data!r}")
        return carried
