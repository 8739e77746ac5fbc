"""What this machine gives gpulaunch, one `Finding` per question (`gpulaunch doctor`).

Each check reads the machine through a `Machine` (its paths, its user, its limits),
so tests run the same checks on a fake tree. Only `supervisors` and `managers` talk
to a live systemd.
"""

from __future__ import annotations

import math
import os
import re
import resource
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from gpulaunch.errors import GpulaunchError
from gpulaunch.logs.journal import rate_limit_settings
from gpulaunch.model import Manager
from gpulaunch.system.cgroupchecks import cgroups, own_cgroups
from gpulaunch.system.files import BUS_POLICY, FIX, Piece
from gpulaunch.system.findings import Finding, Machine, Status
from gpulaunch.units import values

# -- supervisors ---------------------------------------------------------------


@dataclass(frozen=True)
class Verdict:
    """Whether one supervisor can run a job here, and why (or why not)."""

    name: str
    can_run: bool
    why: str
    fix: str = ""
    limits: Callable[[Machine], Iterable[Finding]] = cgroups  # its cgroups rows (cgroupchecks)


def manager_problem(manager: Manager) -> GpulaunchError | None:
    """None when gpulaunch reaches `manager` as `start` would, else the error it gets."""
    try:
        from gpulaunch.supervisor.systemd_api import Systemd

        with Systemd(manager):
            return None
    except GpulaunchError as exc:
        return exc
    except ImportError as exc:  # pystemd's C extension did not load
        return GpulaunchError(f"pystemd cannot be imported ({exc})", "reinstall gpulaunch")


def systemd_supervisor(machine: Machine, problem: GpulaunchError | None) -> Verdict:
    """systemd: every rank a transient scope of the job's manager."""
    title = f"the {machine.manager.value} manager"
    if problem is None:
        return Verdict("systemd", True, f"{title} answers: each rank becomes a scope")
    return Verdict("systemd", False, f"{title} does not answer (see 'systemd' below)")


def direct_supervisor(machine: Machine, problem: GpulaunchError | None) -> Verdict:
    """direct: the watcher's own cgroups, else process groups (gpulaunch/supervisor/direct.py)."""
    from gpulaunch.base.slurm import resource_manager_step
    from gpulaunch.supervisor.cgroups import writable_cgroup

    step = resource_manager_step(machine.env)
    own, why_not = writable_cgroup()
    how = (
        f"a cgroup per rank under {own.path}, stopped with cgroup.kill"
        if own is not None
        else f"process groups, no limits ({why_not})"
    )
    if step is not None:
        how += f"; auto picks it inside {step}"
    return Verdict("direct", True, how, limits=own_cgroups)


# One entry per supervisor, in order of preference: a job gets the first that can run
# (--supervisor auto; except inside a Slurm step, where it is direct).
SupervisorProbe = Callable[[Machine, "GpulaunchError | None"], Verdict]
SUPERVISORS: tuple[SupervisorProbe, ...] = (systemd_supervisor, direct_supervisor)


def supervisors(machine: Machine, verdicts: Sequence[Verdict]) -> Iterable[Finding]:
    chosen = next((v for v in verdicts if v.can_run), None)
    if chosen is None:
        yield Finding(
            "supervisor",
            "a job gets",
            Status.FAIL,
            "none: no supervisor can run here",
        )
    else:
        yield Finding("supervisor", "a job gets", Status.OK, f"{chosen.name}: {chosen.why}")
    for v in verdicts:
        status = Status.OK if v.can_run else Status.WARN
        yield Finding("supervisor", v.name, status, v.why, "" if v.can_run else v.fix)


# -- systemd managers and user jobs ---------------------------------------------


def managers(machine: Machine, problems: dict[Manager, GpulaunchError | None]) -> Iterable[Finding]:
    for manager, problem in problems.items():
        default = manager is machine.manager
        item = f"{manager.value} manager" + (" (default)" if default else "")
        if problem is None:
            yield Finding("systemd", item, Status.OK, "reachable")
        else:
            if default:
                yield Finding("systemd", item, Status.FAIL, problem.message, problem.hint or "")
            else:  # only --system/--user would use it
                yield Finding("systemd", item, Status.INFO, problem.message)


def user_jobs(machine: Machine) -> Iterable[Finding]:
    """A user manager needs XDG_RUNTIME_DIR; linger keeps it (and --detach jobs) past logout."""
    if machine.manager is Manager.SYSTEM:
        yield Finding("user jobs", "linger", Status.INFO, "not needed: root's jobs are system jobs")
        return
    runtime = machine.env.get("XDG_RUNTIME_DIR")
    if runtime and machine.path(runtime).is_dir():
        yield Finding("user jobs", "XDG_RUNTIME_DIR", Status.OK, runtime)
    else:  # start finds the bus at /run/user/UID, or runs under the direct supervisor
        yield Finding(
            "user jobs",
            "XDG_RUNTIME_DIR",
            Status.WARN,
            f"{runtime or 'not set'}: the user manager is looked for at its default place only",
            "log in through a session that starts user@$UID.service (ssh, machinectl shell)",
        )
    user = machine.user
    if machine.path(f"/var/lib/systemd/linger/{user}").exists():
        yield Finding("user jobs", "linger", Status.OK, f"on for {user}: jobs outlive the login")
    else:
        yield Finding(
            "user jobs",
            "linger",
            Status.WARN,
            f"off for {user}: your jobs stop when your last session ends",
            f"loginctl enable-linger {user}",
        )


def user_bus(machine: Machine) -> Iterable[Finding]:
    """A user bus (dbus-user-session), else the user manager's private socket (issue 29)."""
    if machine.manager is Manager.SYSTEM:
        return
    from gpulaunch.base.userbus import find_user_manager

    try:
        found = find_user_manager(dict(machine.env), machine.uid)
    except GpulaunchError as exc:
        yield Finding("user jobs", "user bus", Status.INFO, f"none: {exc.message}")
        return
    if not found.peer:
        yield Finding("user jobs", "user bus", Status.OK, f"{found.path}: the job API is on it")
        return
    yield Finding(
        "user jobs",
        "user bus",
        Status.WARN,
        f"none ({found.no_bus}): jobs get systemd's supervision through {found.path}, "
        "but no job API on D-Bus (status, wait and stop read the record file and the journal)",
        "install dbus-user-session (apt install dbus-user-session), then log in again",
    )


# -- the bus policy and journald ------------------------------------------------


def bus_policy(machine: Machine) -> Iterable[Finding]:
    target = BUS_POLICY.at(machine.root)
    # Only system jobs need it: a user job publishes on its user's own session bus.
    off = Status.WARN if machine.manager is Manager.SYSTEM else Status.INFO
    if BUS_POLICY.installed(machine.root):
        yield Finding("job API", "bus policy", Status.OK, f"{BUS_POLICY.target} installed")
    elif target.exists():
        yield Finding(
            "job API",
            "bus policy",
            off,
            f"{BUS_POLICY.target} differs from this gpulaunch's",
            FIX[Piece.BUS_POLICY],
        )
    else:
        yield Finding(
            "job API",
            "bus policy",
            off,
            "not installed: system jobs run without their job API (status, stop, wait)",
            FIX[Piece.BUS_POLICY],
        )


CHATTY_RANKS = 4
CHATTY_RATE = 10_000  # lines per second per rank


def timespan_seconds(text: str) -> float | None:
    """Seconds of a systemd time span (30s, 1min 30s, 1d, 2hr: units/values.py's parser,
    systemd's own rules); None where systemd would not read it either; infinity is inf."""
    try:
        usec = values.parse_timespan(text)
    except values.InvalidValue:
        return None
    return math.inf if usec == values.INFINITY else usec / values.USEC_PER_SEC


def modulated_burst(burst: int, available: int) -> int:
    """journald scales the burst with the journal's free space (journald-rate-limit.c)."""
    k = max(available, 1).bit_length() - 1  # log2
    return burst if k <= 20 else burst * (k - 16) // 4


def journal_space(machine: Machine) -> int | None:
    """Bytes journald may still use, about as journald computes it (journald.conf(5))."""
    for d in ("/var/log/journal", "/run/log/journal"):
        try:
            st = os.statvfs(machine.path(d))
        except OSError:
            continue
        size, free = st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize
        cap = 4 << 30
        max_use, keep_free = min(size // 10, cap), min(size * 15 // 100, cap)
        return max(0, min(max_use, free - keep_free))
    return None


def journald(machine: Machine) -> Iterable[Finding]:
    burst, interval_text = rate_limit_settings(machine.root)
    interval = timespan_seconds(interval_text)
    if burst == 0 or interval == 0:
        yield Finding("journald", "rate limit", Status.OK, "off: journald keeps every line")
        return
    if interval is None:
        yield Finding(
            "journald",
            "rate limit",
            Status.WARN,
            f"unreadable: {interval_text!r}",
            FIX[Piece.JOURNALD],
        )
        return
    space = journal_space(machine)
    effective = modulated_burst(burst, space) if space is not None else burst
    kept = min(1.0, effective / (CHATTY_RATE * interval))
    detail = (
        f"{effective} lines per {interval_text} per rank; of a {CHATTY_RANKS}-rank job "
        f"printing {CHATTY_RATE:,} lines/s per rank it keeps {kept:.1%}"
    )
    if kept >= 1.0:
        yield Finding("journald", "rate limit", Status.OK, detail)
    else:
        yield Finding(
            "journald",
            "rate limit",
            Status.WARN,
            detail + " (the terminal and --log-dir get all)",
            FIX[Piece.JOURNALD],
        )


# -- file descriptors -----------------------------------------------------------

# The watcher's fds: gpulaunch/watcher/limits.py counts them. It raises its soft limit
# to the hard one when a job needs it, so only the hard limit bounds a job.


def ranks_allowed(limit: int) -> int:
    from gpulaunch.watcher.limits import FDS_PER_RANK, WATCHER_BASE_FDS

    return max(0, (limit - WATCHER_BASE_FDS) // FDS_PER_RANK)


def fd_limits(machine: Machine) -> Iterable[Finding]:
    soft, hard = machine.nofile
    unlimited = hard == resource.RLIM_INFINITY
    allowed = "unlimited ranks" if unlimited else f"~{ranks_allowed(hard)} ranks"
    detail = f"soft {soft}, hard {hard} ({allowed}; gpulaunch raises its soft limit to the hard)"
    status = Status.OK if unlimited or ranks_allowed(hard) >= 64 else Status.WARN
    fix = "" if status is Status.OK else "raise the hard limit (LimitNOFILE=, limits.conf)"
    yield Finding("limits", "open files", status, detail, fix)


# -- NVIDIA ---------------------------------------------------------------------


def nvidia(machine: Machine) -> Iterable[Finding]:
    from gpulaunch.plan.gpus import MachineInventory, nvml_gpus

    version = machine.path("/proc/driver/nvidia/version")
    try:
        driver = version.read_text().splitlines()[0]
    except (OSError, IndexError):
        driver = ""
    if driver:
        found = re.search(r"Kernel Module\s+(?:for\s+\S+\s+)?(\S+)", driver)
        yield Finding("gpu", "NVIDIA driver", Status.OK, found.group(1) if found else driver)
    else:
        yield Finding("gpu", "NVIDIA driver", Status.INFO, "none: CPU jobs only (--nproc N, gloo)")
    if machine.root == Path("/"):
        nvml = nvml_gpus()
        if nvml is not None:
            yield Finding("gpu", "NVML", Status.OK, f"works, {len(nvml)} GPU(s)")
        else:
            yield Finding(
                "gpu",
                "NVML",
                Status.WARN if driver else Status.INFO,
                "not usable: GPUs are read from /proc/driver/nvidia",
                "pip install 'gpulaunch[gpu]'" if driver else "",
            )
    gpus = MachineInventory(
        machine.path("/proc"), machine.path("/sys"), use_nvml=machine.root == Path("/")
    ).gpus()
    if not gpus:
        yield Finding("gpu", "GPUs", Status.INFO, "none")
        return
    listed = ", ".join(
        f"{g.index} ({g.bus_id}, NUMA {g.numa_node if g.numa_node is not None else '?'})"
        for g in gpus
    )
    yield Finding("gpu", "GPUs", Status.OK, f"{len(gpus)}: {listed}")


def runtime_files(machine: Machine) -> Iterable[Finding]:
    """Where a job's error files go (watcher/errorfile.py): start refuses (69) if unusable."""
    if machine.root != Path("/"):
        return  # a fake tree: the real environment's directory says nothing about it
    from gpulaunch.errors import GpulaunchError
    from gpulaunch.watcher.errorfile import runtime_base, runtime_dir_problem

    try:
        parent = runtime_base(machine.manager) / "gpulaunch"
    except GpulaunchError as exc:
        yield Finding("runtime", "error files", Status.FAIL, exc.message, exc.hint or "")
        return
    problem = runtime_dir_problem(parent)
    if problem is None:
        yield Finding("runtime", "error files", Status.OK, str(parent))
    else:
        fix = f"remove it (rm -r {parent}) or set XDG_RUNTIME_DIR to a directory of your own"
        yield Finding("runtime", "error files", Status.FAIL, problem, fix)


def run_all(machine: Machine) -> list[Finding]:
    """Every check, in the table's order."""
    order = [machine.manager, *(m for m in Manager if m is not machine.manager)]
    problems = {m: manager_problem(m) for m in order}
    verdicts = [probe(machine, problems[machine.manager]) for probe in SUPERVISORS]
    found: list[Finding] = [*supervisors(machine, verdicts), *managers(machine, problems)]
    chosen = next((v for v in verdicts if v.can_run), None)
    for check in (user_jobs, user_bus, runtime_files, bus_policy, journald):
        found.extend(check(machine))
    found.extend(cgroups(machine) if chosen is None else chosen.limits(machine))
    for check in (fd_limits, nvidia):
        found.extend(check(machine))
    return found
