"""Which of a job's limits its systemd manager can enforce here: the cgroup controllers
the manager has to hand to its units (the system manager: the root's; a user manager:
what `user@UID.service` was delegated, cpu memory pids by default, no cpuset).

systemd accepts `MemoryMax=` and `AllowedCPUs=` without the controller and enforces
nothing; the start says so once per option (`gpulaunch doctor` says it beforehand).
"""

from __future__ import annotations

import os
from pathlib import Path

from gpulaunch.model import JobSpec, Manager

CGROUP_ROOT = Path("/sys/fs/cgroup")


def manager_cgroup(manager: Manager, uid: int, root: Path = CGROUP_ROOT) -> Path:
    """The cgroup whose controllers the job's manager can hand to its units."""
    if manager is Manager.SYSTEM:
        return root
    return root / f"user.slice/user-{uid}.slice/user@{uid}.service"


def unenforced(spec: JobSpec, root: Path = CGROUP_ROOT, uid: int | None = None) -> list[str]:
    """One line per limit the job asked for that its manager cannot enforce here."""
    asked = (
        ("--memory-max", "memory", spec.memory_max is not None),
        ("--job-memory-max", "memory", spec.job_memory_max is not None),
        ("--cpus-per-rank/--cpu-bind", "cpuset", any(r.cpus for r in spec.ranks)),
    )
    if not any(wanted for _, _, wanted in asked):
        return []
    where = manager_cgroup(spec.manager, os.getuid() if uid is None else uid, root)
    try:
        controllers = set((where / "cgroup.controllers").read_text().split())
    except OSError:
        return []  # no cgroup v2 here to tell: `gpulaunch doctor` says more
    fix = (
        "delegate it (Delegate= in a drop-in for user@.service) or run as root"
        if spec.manager is Manager.USER
        else "enable it for the system manager's cgroup"
    )
    return [
        f"{option} is not enforced: {spec.manager.value} jobs lack the {controller} "
        f"controller here ({fix})"
        for option, controller, wanted in asked
        if wanted and controller not in controllers
    ]
