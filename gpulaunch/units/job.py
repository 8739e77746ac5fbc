"""The units of one job, rendered from one typed set of template variables.

`JobVars`, `RankVars`, `AnchorVars` and `LaunchVars` (gpulaunch/units/variables.py) are
the template context; this module fills them in from a `JobSpec` (and, for the anchor and
the front end's service, from what only the running process knows).
"""

from __future__ import annotations

import dataclasses
import os
import sys

from gpulaunch.base.argtext import printable
from gpulaunch.base.names import ROOT_SLICE
from gpulaunch.errors import UsageError
from gpulaunch.model import JobSpec, RankSpec
from gpulaunch.schedulers.jobmap import cleanup_argv
from gpulaunch.units.definitions import JobUnits, LaunchSetup, UnitDefinition
from gpulaunch.units.templates import Templates
from gpulaunch.units.variables import AnchorVars, JobVars, LaunchVars, RankVars, TieVars

# Runs under `python3 -I -S` (units/anchor.service): waits for pid argv[1] (whose start time
# is argv[2], against pid reuse) to end. No imports beyond the built-in os and select.
ANCHOR_PROGRAM = """\
import os, select, sys
pid, start = int(sys.argv[1]), sys.argv[2]
try:
    fd = os.pidfd_open(pid)
    with open(f"/proc/{pid}/stat") as f:
        alive = f.read().rsplit(")", 1)[1].split()[19] == start
except OSError:
    alive = False
if alive:
    select.select([fd], [], [])
"""
STOP_MARGIN_S = 10.0  # launch.service: beyond the ranks' grace, before systemd SIGKILLs


def job_vars(spec: JobSpec, unit: str) -> JobVars:
    names = spec.names
    return JobVars(
        job=spec.job,
        job_slice=names.job_slice,
        ranks_slice=names.ranks_slice,
        watcher_scope=names.watcher_scope,
        unit=unit,
        world_size=spec.world_size,
        nproc=spec.nproc,
        grace_sec=spec.grace_sec,
        argv=tuple(printable(arg) for arg in spec.argv),  # as shown: the ranks get the bytes
        memory_max=spec.memory_max,
        job_memory_max=spec.job_memory_max,
        description=printable(" ".join(spec.command)),
    )


def rank_vars(spec: JobSpec, rank: RankSpec) -> RankVars:
    return RankVars(
        **dataclasses.asdict(job_vars(spec, rank.unit)),
        rank=rank.rank,
        local_rank=rank.local_rank,
        gpu=rank.gpu,
        cpus=rank.cpus,
        device_allow=rank.device_allow,
    )


def start_time(pid: int) -> str:
    """The process's start time in clock ticks since boot (/proc/PID/stat, field 22)."""
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[19]


def anchor_vars(spec: JobSpec, watcher_pid: int) -> AnchorVars:
    return AnchorVars(
        **dataclasses.asdict(job_vars(spec, spec.names.anchor_service)),
        python=sys.executable,
        program=ANCHOR_PROGRAM,
        watcher_pid=watcher_pid,
        watcher_start_time=start_time(watcher_pid),
        job_map_cleanup=_job_map_cleanup(spec),
    )


def _job_map_cleanup(spec: JobSpec) -> tuple[str, ...]:
    gpus = {rank.gpu for rank in spec.ranks if rank.gpu is not None}
    if spec.gpu_job_map is None or not gpus:
        return ()
    return tuple(cleanup_argv(sys.executable, spec.gpu_job_map, spec.job, gpus))


def tie_vars(spec: JobSpec, frontend_pid: int) -> TieVars:
    return TieVars(
        **dataclasses.asdict(job_vars(spec, spec.names.tie_service)),
        service=spec.names.launch_service,
        root_slice=ROOT_SLICE,
        python=sys.executable,
        program=ANCHOR_PROGRAM,
        frontend_pid=frontend_pid,
        frontend_start_time=start_time(frontend_pid),
    )


def _rlimit(value: int) -> str:
    return "infinity" if value < 0 else str(value)


def launch_vars(spec: JobSpec, setup: LaunchSetup) -> LaunchVars:
    cwd = setup.working_directory
    if cwd != cwd.strip(" \t") or any(ord(c) < 0x20 or ord(c) == 0x7F for c in cwd):
        # WorkingDirectory= takes the rest of its line, trimmed, unquoted (systemd.exec(5))
        raise UsageError(
            f"the current directory {cwd!r} cannot be a systemd service's working directory "
            "(it starts or ends with a space, or holds a control character)",
            "start the job from another directory (the script's path may point anywhere)",
        )
    return LaunchVars(
        **dataclasses.asdict(job_vars(spec, spec.names.launch_service)),
        exec_start=setup.exec_start,
        working_directory=setup.working_directory,
        environment=setup.environment,
        limits=tuple((name, _rlimit(soft), _rlimit(hard)) for name, soft, hard in setup.limits),
        root_slice=ROOT_SLICE,
        bus_name=setup.bus_name,
        stop_margin_sec=STOP_MARGIN_S,
    )


def render_units(spec: JobSpec, templates: Templates) -> JobUnits:
    """Render the templates for this job: the templates are the source of truth.

    The anchor is rendered once here, for this process, so that a bad template fails before
    anything starts; `JobUnits.anchor` renders it again for the watcher's pid.
    """
    names = spec.names

    def render(template: str, unit: str, context: JobVars) -> UnitDefinition:
        return templates.render(template, unit, _context(context))

    def anchor(watcher_pid: int) -> UnitDefinition:
        return render("anchor.service", names.anchor_service, anchor_vars(spec, watcher_pid))

    def launch(setup: LaunchSetup) -> UnitDefinition:
        return render("launch.service", names.launch_service, launch_vars(spec, setup))

    def tie(frontend_pid: int) -> UnitDefinition:
        return render("tie.service", names.tie_service, tie_vars(spec, frontend_pid))

    anchor(os.getpid())
    return JobUnits(
        job=spec.job,
        job_slice=render("job.slice", names.job_slice, job_vars(spec, names.job_slice)),
        ranks_slice=render("ranks.slice", names.ranks_slice, job_vars(spec, names.ranks_slice)),
        watcher=render("watcher.scope", names.watcher_scope, job_vars(spec, names.watcher_scope)),
        ranks=tuple(render("rank.scope", rank.unit, rank_vars(spec, rank)) for rank in spec.ranks),
        anchor=anchor,
        launch=launch,
        tie=tie,
    )


def _context(values: JobVars) -> dict[str, object]:
    """Fields as jinja2 sees them: sequences as lists (tuples print oddly in templates)."""
    out: dict[str, object] = {}
    for f in dataclasses.fields(values):
        value = getattr(values, f.name)
        out[f.name] = (
            [list(v) if isinstance(v, tuple) else v for v in value]
            if isinstance(value, tuple)
            else value
        )
    return out
