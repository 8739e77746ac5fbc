"""The direct supervisor's keeper, seen from `gpulaunch start` (supervisor/keeper.py is the
keeper itself): whether to fork it before anything of the job exists, forking it with what
it removes when the watcher is gone, and telling the direct supervisor of it.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

from gpulaunch.base.slurm import resource_manager_step
from gpulaunch.errors import GpulaunchError
from gpulaunch.model import JobSpec, SupervisorKind
from gpulaunch.schedulers.observers import after_the_watcher
from gpulaunch.supervisor.choose import Chosen, systemd_wanted
from gpulaunch.supervisor.keeper import KeeperLink


def direct_likely(kind: SupervisorKind) -> bool:
    """The direct supervisor is asked for, or sure (a Slurm step), or `auto` where systemd
    did not boot this machine (sd_booted(3): no /run/systemd/system, as in a container)."""
    if not systemd_wanted(kind, os.environ):
        return True
    return kind is SupervisorKind.AUTO and not os.path.isdir("/run/systemd/system")


def fork_keeper_for(spec: JobSpec) -> KeeperLink:
    """Become the keeper (never returns) in the parent; the watcher goes on in the child."""
    from gpulaunch.supervisor.keeper import fork_keeper
    from gpulaunch.watcher.errorfile import prune_dead, runtime_base

    try:
        error_dirs: Path | None = runtime_base(spec.manager) / "gpulaunch"
    except GpulaunchError:
        error_dirs = None  # the watcher says why, once

    def at_end(status: int) -> None:  # the watcher is gone, and everything of its ranks
        if error_dirs is not None:  # its error-file directory
            prune_dead(error_dirs)
        after_the_watcher(spec, status)  # DCGM's map, Kubernetes' termination message

    return fork_keeper(resource_manager_step(os.environ) is not None, at_end)


def kept(chosen: Chosen, keeper: KeeperLink | None) -> Chosen:
    """The direct supervisor told of its keeper; the start line says what it guarantees."""
    from gpulaunch.supervisor.direct import CgroupSupervisor, ProcessGroupSupervisor

    supervisor = chosen.supervisor
    assert isinstance(supervisor, CgroupSupervisor | ProcessGroupSupervisor)
    before = supervisor.guarantees()
    supervisor.keeper = keeper
    return replace(chosen, line=supervisor.guarantees() + chosen.line.removeprefix(before))
