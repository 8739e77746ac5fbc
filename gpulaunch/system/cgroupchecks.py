"""The doctor's cgroups rows: which limits a job gets here, under the supervisor it gets."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from gpulaunch.model import Manager
from gpulaunch.system.findings import Finding, Machine, Status

# What each rank limit needs from the cgroup tree (systemd.resource-control(5)).
LIMITS = (
    ("--memory-max", "memory", "MemoryMax="),
    ("--cpus-per-rank", "cpuset", "AllowedCPUs="),
)


def cgroup_of(machine: Machine) -> Path:
    """The cgroup whose controllers the job's manager can hand to its units."""
    root = machine.path("/sys/fs/cgroup")
    if machine.manager is Manager.SYSTEM:
        return root
    uid = machine.uid
    return root / f"user.slice/user-{uid}.slice/user@{uid}.service"


def cgroups(machine: Machine) -> Iterable[Finding]:
    """What the limits do for a job here under a supervisor whose manager enforces them
    (`Capabilities.manager_limits`: systemd's units)."""
    where = cgroup_of(machine)
    try:
        controllers = set((where / "cgroup.controllers").read_text().split())
    except OSError:
        controllers = None
    if controllers is None:
        yield Finding(
            "cgroups",
            "cgroup v2",
            Status.WARN,
            f"no {where}/cgroup.controllers: rank limits are accepted but not enforced",
            "boot with the unified cgroup hierarchy (systemd.unified_cgroup_hierarchy=1)",
        )
        return
    for option, controller, setting in LIMITS:
        if controller in controllers:
            yield Finding("cgroups", option, Status.OK, f"enforced ({setting}, {controller})")
        else:
            fix = (
                f"delegate it: Delegate={controller} in a drop-in for user@.service, or run as root"
                if machine.manager is Manager.USER
                else f"in a container, have its host delegate {controller} to it; on a host, "
                f"enable {controller} in the kernel"
            )
            yield Finding(
                "cgroups",
                option,
                Status.WARN,
                f"accepted, not enforced: {machine.manager.value} jobs lack the {controller} "
                "controller",
                fix,
            )
    if machine.manager is Manager.SYSTEM:
        yield Finding("cgroups", "--gpu-isolation", Status.OK, "enforced (DevicePolicy=closed)")
    else:
        yield Finding(
            "cgroups",
            "--gpu-isolation",
            Status.WARN,
            "accepted, not enforced: a user manager cannot install device filters",
            "run the job as root (a system job)",
        )


def own_cgroups(machine: Machine) -> Iterable[Finding]:
    """What the limits do for a job here under a supervisor that enforces them itself (the
    direct one, in the cgroup it can write)."""
    from gpulaunch.supervisor.cgroups import writable_cgroup

    own, why_not = writable_cgroup()
    return direct_cgroups(None if own is None else own.path, why_not)


def direct_cgroups(own: Path | None, why_not: str) -> Iterable[Finding]:
    """The direct supervisor's limits: its own cgroup's controllers, else none at all."""
    if own is None:
        for option, _, _ in LIMITS:
            yield Finding(
                "cgroups",
                option,
                Status.WARN,
                f"accepted, not enforced: the direct supervisor runs process groups here "
                f"({why_not})",
                "give the job a writable cgroup (podman: --security-opt unmask=/sys/fs/cgroup; "
                "systemd: Delegate=yes), or run it under systemd",
            )
    else:
        try:
            controllers = set((own / "cgroup.controllers").read_text().split())
        except OSError:
            controllers = set()
        for option, controller, _ in LIMITS:
            if controller in controllers:
                detail = f"enforced (the direct supervisor: {controller} in a cgroup per rank)"
                yield Finding("cgroups", option, Status.OK, detail)
            else:
                yield Finding(
                    "cgroups",
                    option,
                    Status.WARN,
                    f"accepted, not enforced: {own} lacks the {controller} controller",
                    f"have whoever made {own} delegate {controller} to it",
                )
    yield Finding(
        "cgroups",
        "--gpu-isolation",
        Status.WARN,
        "accepted, not enforced: the direct supervisor installs no device filter",
        "run the job under systemd as root",
    )
