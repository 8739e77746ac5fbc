"""The job's hand-over to the cluster's tools, as parts of the job
(gpulaunch/parts.py): DCGM's job map while it runs, Kubernetes' termination
message when it ends. start.py builds them (`scheduler_observers`); what outlives a killed
watcher (the anchor, the keeper) finishes their work after a SIGKILL."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from pathlib import Path

from gpulaunch.model import JobProgress, JobReport, JobSpec
from gpulaunch.parts import Controls, Part
from gpulaunch.schedulers.jobmap import add_job, remove_job
from gpulaunch.schedulers.termination import (
    killed_watcher_message,
    termination_message,
    write_message,
)


class TerminationLog(Part):
    """Writes the termination message once the report is complete."""

    def __init__(self, path: Path, warn: Callable[[str], None]) -> None:
        self.path = path
        self.warn = warn

    async def finished(self, job: JobProgress, report: JobReport) -> None:
        why = write_message(self.path, termination_message(report))
        if why is not None:
            self.warn(why)


class JobMapEntry(Part):
    """The job's line in DCGM's map for each of its GPUs: there before the first rank
    starts (the watcher attaches its observers first), gone when the job ends."""

    def __init__(
        self, directory: Path, job: str, gpus: frozenset[int], warn: Callable[[str], None]
    ):
        self.directory, self.job, self.gpus, self.warn = directory, job, gpus, warn

    def attach(self, job: JobProgress, controls: Controls, loop: asyncio.AbstractEventLoop) -> None:
        try:
            add_job(self.directory, self.job, self.gpus)
        except OSError as exc:
            self.warn(f"--gpu-job-map: cannot write {self.directory}: {exc.strerror}")

    async def finished(self, job: JobProgress, report: JobReport) -> None:
        self.remove()

    def remove(self) -> None:
        try:
            remove_job(self.directory, self.job, self.gpus)
        except OSError as exc:
            self.warn(f"--gpu-job-map: cannot update {self.directory}: {exc.strerror}")


def job_gpus(spec: JobSpec) -> frozenset[int]:
    """The indices of the GPUs the job's ranks on this node hold."""
    return frozenset(rank.gpu for rank in spec.ranks if rank.gpu is not None)


def scheduler_observers(
    spec: JobSpec, warn: Callable[[str], None]
) -> tuple[TerminationLog | JobMapEntry, ...]:
    """What this job hands the cluster's tools (none asked for and not in a pod: nothing)."""
    found: list[TerminationLog | JobMapEntry] = []
    if spec.termination_log is not None:
        found.append(TerminationLog(spec.termination_log, warn))
    gpus = job_gpus(spec)
    if spec.gpu_job_map is not None and gpus:
        found.append(JobMapEntry(spec.gpu_job_map, spec.job, gpus, warn))
    return tuple(found)


def after_the_watcher(spec: JobSpec, status: int) -> None:
    """The keeper's part (direct supervisor) once the watcher is gone: the job's lines off
    DCGM's map, and, if the watcher was killed (it wrote nothing), a termination message
    that says so."""
    gpus = job_gpus(spec)
    if spec.gpu_job_map is not None and gpus:
        remove_job(spec.gpu_job_map, spec.job, gpus)
    if spec.termination_log is not None and os.WIFSIGNALED(status):
        write_message(spec.termination_log, killed_watcher_message(spec.job, os.WTERMSIG(status)))
