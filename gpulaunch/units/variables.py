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


@dataclass(frozen=True)
class AnchorVars(JobVars):
    """What `anchor.service` gets on top of `JobVars` (supervisor/anchor.py says why)."""

    python: str  # the Python that runs the anchor's program (gpulaunch's own)
    program: str  # the anchor's program, for `python -I -S -c` (several lines: quote it)
    watcher_pid: int  # the watcher it waits for
    watcher_start_time: str  # its start time in clock ticks (/proc/PID/stat), against pid reuse
    # --gpu-job-map: the command that takes the job off DCGM's map once the watcher is gone
    # (ExecStopPost=: also after a SIGKILL; gpulaunch/schedulers/jobmap.py); empty: none
    job_map_cleanup: tuple[str, ...] = ()


@dataclass(frozen=True)
class TieVars(JobVars):
    """What `tie.service` gets on top of `JobVars`: the front end's death tie where the user
    manager has no user bus (units/tie.service says why)."""

    service: str  # the watcher's service (launch.service) the front end's end stops
    root_slice: str  # gpulaunch.slice
    python: str  # the Python that runs the wait program (gpulaunch's own)
    program: str  # the anchor's wait program, for `python -I -S -c`
    frontend_pid: int  # the front end it waits for
    frontend_start_time: str  # its start time in clock ticks (/proc/PID/stat), against pid reuse


@dataclass(frozen=True)
class LaunchVars(JobVars):
    """What `launch.service` gets on top of `JobVars`: the front end's watcher service
    (frontend/unit.py says why it exists)."""

    exec_start: tuple[str, ...]  # the watcher's command line, first the Python running it
    working_directory: str  # the front end's current directory
    environment: tuple[str, ...]  # the front end's environment, NAME=VALUE
    limits: tuple[tuple[str, str, str], ...]  # (NAME, soft, hard) of the front end's rlimits
    root_slice: str  # gpulaunch.slice
    bus_name: str | None  # the front end's bus name (None: --detach, not tied to it)
    stop_margin_sec: float  # beyond grace_sec, before systemd SIGKILLs a watcher that hangs


def context_hint() -> str:
    """The variables a template may use, for error messages."""
    job = [f.name for f in dataclasses.fields(JobVars)]

    def extra(cls: type[JobVars]) -> str:
        return ", ".join(f.name for f in dataclasses.fields(cls) if f.name not in job)

    return (
        f"variables: {', '.join(job)}; rank.scope also {extra(RankVars)}; anchor.service "
        f"also {extra(AnchorVars)}; launch.service also {extra(LaunchVars)} "
        "(gpulaunch/units/variables.py documents them)"
    )
