"""Why Slurm sent SIGTERM: a requeue, a cancel, or the job's time limit.

Slurm signals a job the same way for a preemption or `scontrol requeue` (it will run again),
an `scancel` (it will not) and its `--time` running out; only the controller knows which.
`scontrol show job -o $SLURM_JOB_ID`, asked when the signal came, tells them apart
(Slurm 22.05 in the box answered so; tests/unit/test_schedulers.py holds its answers,
tests/integration/test_slurm_ends.py runs the three):

- requeued: `Restarts=` is already past the run's own `SLURM_RESTART_COUNT` (the
  controller counted the requeue before it signalled this run);
- time limit: `Reason=TimeLimit` (or `RunTime=` has reached `TimeLimit=`);
- cancelled: neither, and the job ending (`JobState=COMPLETING` or `CANCELLED`); a job
  still RUNNING got a notice (`scancel --signal`, `--signal=B:TERM@S`), not an end.

Where `scontrol` does not answer, `SLURM_JOB_END_TIME` (set by newer Slurm) tells a time
limit from the rest, and a signal that is neither stays what it was.
"""

from __future__ import annotations

import enum
import signal
import subprocess
import time
from collections.abc import Mapping
from dataclasses import replace

from gpulaunch.model import PREEMPTED_STATUS, TIME_LIMIT_STATUS, Cause, JobReport
from gpulaunch.parts import Part

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
        if fields.get("JobState") in ("CANCELLED", "COMPLETING"):
            return SlurmEnd.CANCELLED
        return None  # the job runs on: a notice (`scancel --signal`, `--signal=B:TERM@S`)
    end = env.get("SLURM_JOB_END_TIME", "")
    if end.isdigit() and now >= int(end) - TIME_LIMIT_MARGIN:
        return SlurmEnd.TIME_LIMIT
    return None


def ask_slurm(env: Mapping[str, str]) -> tuple[SlurmEnd | None, str | None]:
    """Ask the controller why (bounded: SCONTROL_TIMEOUT), and the job's time limit as
    Slurm writes it; (None, None) when not in a Slurm job."""
    job = env.get("SLURM_JOB_ID")
    if not job or not job.isdigit():
        return None, None
    answer: str | None = None
    try:
        res = subprocess.run(
            ["scontrol", "show", "job", "-o", job],
            capture_output=True, text=True, timeout=SCONTROL_TIMEOUT, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        answer = res.stdout if res.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired):  # no scontrol here, or no answer in time
        pass
    limit = _fields(answer).get("TimeLimit") if answer else None
    return classify(answer, env, time.time()), limit


class SlurmEnds(Part):
    """A job that Slurm's SIGTERM ended: its report says which end it was (`complete`).

    - requeued (a preemption, `scontrol requeue`): preempted, 79, so that a site's
      `RequeueExit=79` and the record agree with what Slurm does anyway;
    - cancelled (`scancel`): interrupted, 143, also with `--preempt-grace` (which took the
      SIGTERM for a preemption): a cancelled job is never asked to be requeued;
    - its time limit: TIME_LIMIT_STATUS (85), "ran out of time", with the limit.

    Asked once, when the job ended by a SIGTERM to the watcher inside a Slurm job: the
    controller still shows the run then (its state COMPLETING)."""

    def __init__(self, env: Mapping[str, str]) -> None:
        self.env = env

    def complete(self, report: JobReport) -> JobReport:
        if report.cause not in (Cause.INTERRUPTED, Cause.PREEMPTED):
            return report
        if report.interrupt_signal not in (None, signal.SIGTERM) or report.interrupted_by:
            return report  # SIGINT at a terminal, `gpulaunch stop`, a stop from outside
        end, limit = ask_slurm(self.env)
        if end is SlurmEnd.TIME_LIMIT:
            what = f"Slurm's time limit of {limit}" if limit else "Slurm's time limit"
            return replace(
                report, status=TIME_LIMIT_STATUS, cause=Cause.TIME_LIMIT, interrupted_by=what
            )
        if end is SlurmEnd.CANCELLED:
            return replace(
                report,
                status=128 + signal.SIGTERM,
                cause=Cause.INTERRUPTED,
                interrupt_signal=signal.SIGTERM,
                interrupted_by="scancel (Slurm cancelled the job)",
            )
        if end is SlurmEnd.REQUEUED:
            return replace(report, status=PREEMPTED_STATUS, cause=Cause.PREEMPTED)
        return report


def slurm_ends(env: Mapping[str, str]) -> tuple[SlurmEnds, ...]:
    """The part, inside a Slurm job (SLURM_JOB_ID); none elsewhere."""
    return (SlurmEnds(env),) if env.get("SLURM_JOB_ID") else ()
