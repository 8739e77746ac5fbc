"""Why Slurm sent SIGTERM: a requeue, a cancel, or the job's time limit.

Slurm signals a job the same way for a preemption or `scontrol requeue` (it will run again),
an `scancel` (it will not) and its `--time` running out; only the controller knows which.
`scontrol show job -o $SLURM_JOB_ID`, asked when the signal came, tells them apart
(Slurm 22.05 in the box answered so; tests/unit/test_schedulers.py holds its answers):

- requeued: `Restarts=` is already past the run's own `SLURM_RESTART_COUNT` (the
  controller counted the requeue before it signalled this run);
- time limit: `Reason=TimeLimit` (or `RunTime=` has reached `TimeLimit=`);
- cancelled: neither (`JobState=COMPLETING` or `CANCELLED`, the end time now).

Where `scontrol` does not answer, `SLURM_JOB_END_TIME` (set by newer Slurm) tells a time
limit from the rest, and a signal that is neither stays what it was.
"""

from __future__ import annotations

import asyncio
import enum
import time
from collections.abc import Mapping

SCONTROL_TIMEOUT = 3.0  # seconds the report may wait for the controller's answer
TIME_LIMIT_MARGIN = 5.0  # seconds: a signal this close to SLURM_JOB_END_TIME is the limit's


class SlurmEnd(enum.StrEnum):
    """Why Slurm ended the job's run."""

    REQUEUED = "requeued"  # a preemption that requeues, `scontrol requeue`: it runs again
    CANCELLED = "cancelled"  # `scancel`: it does not
    TIME_LIMIT = "time-limit"  # its `--time` ran out


def _fields(text: str) -> dict[str, str]:
    out = {}
    for word in text.split():
        key, sep, value = word.partition("=")
        if sep and key not in out:
            out[key] = value
    return out


def _seconds(span: str) -> float | None:
    """Slurm's `[D-]HH:MM:SS` (also `MM:SS`); None for UNLIMITED and the like."""
    days, _, rest = span.rpartition("-")
    parts = rest.split(":")
    if (
        not all(p.isdigit() for p in parts)
        or not 1 <= len(parts) <= 3
        or (days and not days.isdigit())
    ):
        return None
    seconds = 0
    for part in parts:
        seconds = seconds * 60 + int(part)
    return seconds + (int(days) * 86400 if days else 0)


def classify(scontrol: str | None, env: Mapping[str, str], now: float) -> SlurmEnd | None:
    """What `scontrol show job -o` (None: no answer) and the job's environment say; None:
    not known (outside Slurm, or no answer and no end time)."""
    if "SLURM_JOB_ID" not in env:
        return None
    if scontrol:
        fields = _fields(scontrol)
        restarts = fields.get("Restarts", "0")
        ours = env.get("SLURM_RESTART_COUNT", "0")
        if restarts.isdigit() and ours.isdigit() and int(restarts) > int(ours):
            return SlurmEnd.REQUEUED
        if fields.get("JobState") in ("PREEMPTED", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD"):
            return SlurmEnd.REQUEUED
        ran, limit = _seconds(fields.get("RunTime", "")), _seconds(fields.get("TimeLimit", ""))
        if fields.get("Reason") == "TimeLimit" or fields.get("JobState") == "TIMEOUT":
            return SlurmEnd.TIME_LIMIT
        if ran is not None and limit is not None and ran >= limit:
            return SlurmEnd.TIME_LIMIT
        return SlurmEnd.CANCELLED
    end = env.get("SLURM_JOB_END_TIME", "")
    if end.isdigit() and now >= int(end) - TIME_LIMIT_MARGIN:
        return SlurmEnd.TIME_LIMIT
    return None


async def ask_slurm(env: Mapping[str, str]) -> SlurmEnd | None:
    """Ask the controller why (bounded: SCONTROL_TIMEOUT); None when not in a Slurm job."""
    job = env.get("SLURM_JOB_ID")
    if not job or not job.isdigit():
        return None
    answer: str | None = None
    try:
        proc = await asyncio.create_subprocess_exec(
            "scontrol", "show", "job", "-o", job,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL,
            stdin=asyncio.subprocess.DEVNULL,
        )  # fmt: skip
        try:
            out, _ = await asyncio.wait_for(proc.communicate(), SCONTROL_TIMEOUT)
            if proc.returncode == 0:
                answer = out.decode(errors="replace")
        except TimeoutError:
            proc.kill()
            await proc.wait()
    except OSError:  # no scontrol here
        pass
    return classify(answer, env, time.time())
