"""The units of one job, rendered from one typed set of template variables.

`JobVars` and `RankVars` (gpulaunch/units/variables.py) are the template
context; this module fills them in from a `JobSpec`.
"""

from __future__ import annotations

import dataclasses

from gpulaunch.model import JobSpec, RankSpec
from gpulaunch.plan.argtext import printable
from gpulaunch.units.definitions import JobUnits, UnitDefinition
from gpulaunch.units.templates import Templates
from gpulaunch.units.variables import JobVars, RankVars


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


def render_units(spec: JobSpec, templates: Templates) -> JobUnits:
    """Render the four templates for this job: the templates are the source of truth."""
    names = spec.names

    def render(template: str, unit: str, context: JobVars) -> UnitDefinition:
        return templates.render(template, unit, _context(context))

    return JobUnits(
        job=spec.job,
        job_slice=render("job.slice", names.job_slice, job_vars(spec, names.job_slice)),
        ranks_slice=render("ranks.slice", names.ranks_slice, job_vars(spec, names.ranks_slice)),
        watcher=render("watcher.scope", names.watcher_scope, job_vars(spec, names.watcher_scope)),
        ranks=tuple(render("rank.scope", rank.unit, rank_vars(spec, rank)) for rank in spec.ranks),
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
