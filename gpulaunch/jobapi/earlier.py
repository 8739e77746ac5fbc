"""What the last run of a requeued Slurm job left in its record (gpulaunch/recovery/requeue.py).

A requeued job (SLURM_RESTART_COUNT above 0) runs again under the same gpulaunch job id
(the default one, `<script>_slurm<job>.<step>`, or `--job`), so the last run's record is
that id's: its record file (the direct supervisor's; any node's, where the records'
directory is shared, as an ordinary user's `~/.local/state` on NFS), else its journal
record (systemd's). Only what the caller itself may trust is read: root's records in
/run/gpulaunch/jobs and journal records of `_UID=0`, a user's own, never a path from the
environment (filerecord.py, record.py). A record is believed only if it names this Slurm
job and an earlier run of it.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from gpulaunch.errors import GpulaunchError
from gpulaunch.jobapi import filerecord, record
from gpulaunch.model import Carried, Manager


def _ours(carried: Carried | None, slurm_job: str, run: int) -> bool:
    """An earlier run's of this Slurm job."""
    return carried is not None and carried.slurm_job == slurm_job and carried.run < run


def earlier_run(
    job: str, manager: Manager, env: Mapping[str, str], base: Path | None = None
) -> Carried | None:
    """The newest earlier run's carried state of this Slurm job, or None (the first run,
    not in Slurm, or no record of it here); `base`: the record files' directory (tests)."""
    slurm_job = env.get("SLURM_JOB_ID", "").strip()
    count = env.get("SLURM_RESTART_COUNT", "0").strip()
    if not slurm_job or not count.isdigit() or int(count) == 0:
        return None
    run = int(count)
    views = [r.view for r in filerecord.recent_records(base) if r.view.job == job]
    if not any(_ours(v.carried, slurm_job, run) for v in views):
        try:
            views = [view] if (view := record.find(job, manager)) is not None else []
        except (GpulaunchError, OSError):  # no journalctl: nothing more to go by
            views = []
    found = [v.carried for v in views if v.carried is not None and _ours(v.carried, slurm_job, run)]
    return max(found, key=lambda c: (c.run, c.attempts)) if found else None
