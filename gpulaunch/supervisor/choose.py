"""Which supervisor runs a job (`--supervisor systemd|direct|auto`), and what it guarantees.

`auto` (the default): systemd where a manager can take the job without moving
it out of a resource manager's cgroup; the direct supervisor inside a Slurm
step (the ranks stay in the step: Slurm's limits, GPU binding, accounting and
scancel keep working), in a container without systemd, or wherever no manager
answers. docs/environments.md has the guarantees of each, side by side.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import ExitStack
from dataclasses import dataclass

from gpulaunch.base.slurm import resource_manager_step
from gpulaunch.errors import NoSystemdError
from gpulaunch.model import JobSpec, SupervisorKind
from gpulaunch.supervisor import Supervisor
from gpulaunch.units.definitions import JobUnits


@dataclass(frozen=True)
class Chosen:
    """The supervisor of a job, and the start line's words about it."""

    supervisor: Supervisor
    line: str  # "<name> supervisor (<where>): <what it guarantees>"
    where: str  # where the ranks are, for the start line and the record


def systemd_wanted(kind: SupervisorKind, env: Mapping[str, str]) -> bool:
    """Whether systemd is tried first: asked for, or `auto` outside a resource manager's step."""
    return kind is SupervisorKind.SYSTEMD or (
        kind is SupervisorKind.AUTO and resource_manager_step(env) is None
    )


def open_supervisor(
    kind: SupervisorKind,
    spec: JobSpec,
    units: JobUnits,
    env: Mapping[str, str],
    stack: ExitStack,
    warn: Callable[[str], None],
) -> Chosen:
    """The job's supervisor, entered on `stack` (undone when the job is done)."""
    step = resource_manager_step(env)
    if systemd_wanted(kind, env):
        try:
            return _systemd(spec, units, stack, step, warn)
        except NoSystemdError as exc:
            if kind is SupervisorKind.SYSTEMD:
                raise
            why = f"no systemd manager answers: {exc.message}"
            if exc.hint:  # what would give the job systemd's supervision
                why += f"; for systemd's supervision: {exc.hint}"
        except ImportError as exc:  # pystemd's C extension did not load
            if kind is SupervisorKind.SYSTEMD:
                raise NoSystemdError(f"pystemd cannot be imported ({exc})", "reinstall") from exc
            why = f"pystemd cannot be imported: {exc}"
    elif kind is SupervisorKind.AUTO:
        why = f"inside {step}: the ranks stay in its cgroup"
    else:
        why = "--supervisor direct"
    return _direct(spec, stack, why, warn)


def _systemd(
    spec: JobSpec, units: JobUnits, stack: ExitStack, step: str | None, warn: Callable[[str], None]
) -> Chosen:
    from gpulaunch.supervisor.systemd import SystemdSupervisor
    from gpulaunch.supervisor.systemd_api import Systemd  # pystemd: only to run jobs

    systemd = stack.enter_context(Systemd(spec.manager))
    if step is not None:
        warn(
            f"--supervisor systemd inside {step}: the ranks leave the step's cgroup for "
            f"{spec.names.job_slice}, out of the resource manager's limits and accounting"
        )
    line = (
        f"{SystemdSupervisor.name} supervisor ({spec.names.job_slice}, "
        f"{spec.manager.value} manager): each rank a scope; watcher SIGKILLed → systemd "
        "stops every rank (BindsTo=); daemonised grandchildren stopped with their rank's scope"
    )
    return Chosen(SystemdSupervisor(systemd, units, warn), line, spec.names.job_slice)


def _direct(spec: JobSpec, stack: ExitStack, why: str, warn: Callable[[str], None]) -> Chosen:
    from gpulaunch.supervisor.cgroups import writable_cgroup
    from gpulaunch.supervisor.direct import CgroupSupervisor, ProcessGroupSupervisor

    own, problem = writable_cgroup()
    supervisor: CgroupSupervisor | ProcessGroupSupervisor
    if own is not None:
        supervisor = stack.enter_context(CgroupSupervisor(spec, own, warn))
    else:
        supervisor = stack.enter_context(ProcessGroupSupervisor(spec, problem, warn))
    return Chosen(supervisor, f"{supervisor.guarantees()} [{why}]", supervisor.where)
