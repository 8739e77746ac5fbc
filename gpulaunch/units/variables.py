"""The template variables: every variable a unit template may use, typed, documented once.

`gpulaunch/units/job.py` fills them in for one job; `templates.py` names them
in its errors; the templates and the README point here.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass


@dataclass(frozen=True)
class JobVars:
    """What every template gets. None means "not set": guard with `{% if x is not none %}`."""

    job: str  # the job id as the user typed it (any text: filter it)
    job_slice: str  # full unit names
    ranks_slice: str
    watcher_scope: str
    unit: str  # the name of the unit being rendered
    world_size: int  # ranks in the whole job (all nodes)
    nproc: int  # ranks on this node
    grace_sec: float  # seconds between SIGTERM and SIGKILL
    argv: tuple[str, ...]  # the command the ranks run
    memory_max: str | None  # per rank, systemd size syntax ("12G", "50%"): --memory-max
    job_memory_max: str | None  # all ranks and the watcher together: --job-memory-max
    description: str  # free text about the job: the command the user gave


@dataclass(frozen=True)
class RankVars(JobVars):
    """What `rank.scope` gets on top of `JobVars` (gpulaunch/plan/placement.py decides them)."""

    rank: int  # global rank
    local_rank: int
    gpu: int | None  # the rank's GPU as nvidia-smi numbers it
    cpus: str | None  # AllowedCPUs=, e.g. "0-3,8"
    device_allow: tuple[tuple[str, str], ...]  # (path, rights) pairs; empty: no isolation


def context_hint() -> str:
    """The variables a template may use, for error messages."""
    job = [f.name for f in dataclasses.fields(JobVars)]
    rank = [f.name for f in dataclasses.fields(RankVars) if f.name not in job]
    return (
        f"variables: {', '.join(job)}; rank.scope also {', '.join(rank)} "
        "(gpulaunch/units/job.py documents them)"
    )
