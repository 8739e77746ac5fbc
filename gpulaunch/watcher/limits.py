"""The watcher's limits on open files and processes: check a job fits, make room, give back.

A login shell's soft RLIMIT_NOFILE is often 1024 (systemd's default, with a
much higher hard limit: systemd.exec(5), `LimitNOFILE=`, which advises
programs that need more to raise their own soft limit to the hard one). The
watcher holds a few fds per rank, so a big job needs more than 1024: it raises
its soft limit to the hard one when the job needs it (base/nofile.py), and each rank and log
pump gets the soft limit back before it runs (ranks see the limit the user
had, as under torchrun; `select()`-based code in a rank must not see fds past
FD_SETSIZE because of us). A job that cannot fit even then fails before
anything is created, with one line naming the limit.

What the watcher holds per rank, counted in watcher/loop.py (`_fork_rank`,
`_open_gates`) and base/procs.py (`fork_held`):

  rank pidfd, pump pidfd                             2
  live stdout and stderr pipes (read ends)           2
  the rank's and the pump's start gates, until the
  gates open (all at once, when every rank is in
  its scope)                                         2
  --log-dir: the rank's log file                     1

  FDS_PER_RANK = 6 (+1 with --log-dir)

While a rank is being forked the watcher holds a few more for a moment (its
pipes, a gate pipe, a pidfd): part of the base. The base also covers stdio,
the epoll fd, the wakeup socketpair, asyncio's self-pipe, the bus connections
(systemd's, the job API's), the journal and error-file fds, a multi-node peer
link, and Python's own.

    job_needs(nproc).fds = WATCHER_BASE_FDS + nproc * (FDS_PER_RANK [+ FDS_PER_RANK_LOG_DIR])

Measured in the box (scripts like tests/integration/test_limits.py, the check
disabled, the smallest soft=hard limit with which a job of N ranks succeeds,
by bisection): 17 + 6 N (N = 8, 32, 64), and 16 + 7 N with --log-dir; a
running job holds 12 + 4 N (`ls /proc/<watcher>/fd`). WATCHER_BASE_FDS = 64
leaves room for what the box did not have (a peer, more bus traffic).

Processes: each rank and its log pump, plus the watcher and a multi-node peer.
What a rank starts itself (threads, dataloader workers) cannot be known here.
"""

from __future__ import annotations

import os
import resource
from dataclasses import dataclass
from pathlib import Path

from gpulaunch.errors import UsageError

WATCHER_BASE_FDS = 64
FDS_PER_RANK = 6
FDS_PER_RANK_LOG_DIR = 1
PROCESSES_PER_RANK = 2  # the rank and its log pump
WATCHER_PROCESSES = 2  # the watcher and a multi-node peer


@dataclass(frozen=True)
class Needs:
    """What a job needs of the watcher's limits."""

    fds: int
    processes: int


@dataclass(frozen=True)
class Limits:
    """The limits a job must fit in, as read from the system (see `read_limits`)."""

    nofile_hard: int
    nproc_soft: int | None  # RLIMIT_NPROC; None: unlimited, or not enforced (root)
    pid_max: int | None  # kernel.pid_max; None: unknown
    threads_max: int | None  # kernel.threads-max; None: unknown
    tasks_now: int  # threads that exist now, system-wide (/proc/loadavg)


def job_needs(nproc: int, log_dir: bool = False) -> Needs:
    """The fds and processes a job of `nproc` ranks on this node needs (formula above)."""
    per_rank = FDS_PER_RANK + (FDS_PER_RANK_LOG_DIR if log_dir else 0)
    return Needs(
        fds=WATCHER_BASE_FDS + nproc * per_rank,
        processes=WATCHER_PROCESSES + nproc * PROCESSES_PER_RANK,
    )


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def read_limits(proc: Path = Path("/proc")) -> Limits:
    """The limits that apply to a job started now by this process."""
    _, nofile_hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    nproc_soft: int | None = resource.getrlimit(resource.RLIMIT_NPROC)[0]
    # The kernel does not apply RLIMIT_NPROC to root (CAP_SYS_RESOURCE/CAP_SYS_ADMIN).
    if nproc_soft == resource.RLIM_INFINITY or os.geteuid() == 0:
        nproc_soft = None
    loadavg = (proc / "loadavg").read_text().split() if (proc / "loadavg").exists() else []
    tasks_now = int(loadavg[3].split("/")[1]) if len(loadavg) > 3 else 0
    return Limits(
        nofile_hard=nofile_hard,
        nproc_soft=nproc_soft,
        pid_max=_read_int(proc / "sys/kernel/pid_max"),
        threads_max=_read_int(proc / "sys/kernel/threads-max"),
        tasks_now=tasks_now,
    )


def job_does_not_fit(nproc: int, needs: Needs, limits: Limits) -> UsageError | None:
    """Why a job with these needs cannot run under these limits, or None if it can."""
    job = f"a job of {nproc} rank{'s' if nproc != 1 else ''}"
    fewer = "or start fewer ranks (--nproc)"
    if limits.nofile_hard != resource.RLIM_INFINITY and needs.fds > limits.nofile_hard:
        return UsageError(
            f"{job} needs about {needs.fds} open files in the watcher, more than the hard "
            f"limit on open files ({limits.nofile_hard}, see 'ulimit -Hn')",
            "raise it (LimitNOFILE= of the service or user@.service, "
            f"/etc/security/limits.conf, or 'ulimit -Hn {needs.fds}' as root), {fewer}",
        )
    if limits.nproc_soft is not None and needs.processes > limits.nproc_soft:
        return UsageError(
            f"{job} needs at least {needs.processes} processes (each rank and its log pump), "
            f"more than the limit on processes ({limits.nproc_soft}, see 'ulimit -u')",
            f"raise it ('ulimit -u', LimitNPROC=, /etc/security/limits.conf), {fewer}",
        )
    for name, value in (
        ("kernel.pid_max", limits.pid_max),
        ("kernel.threads-max", limits.threads_max),
    ):
        if value is not None and needs.processes > value - limits.tasks_now:
            return UsageError(
                f"{job} needs at least {needs.processes} processes, more than {name} "
                f"({value}, {limits.tasks_now} in use) leaves",
                f"raise it (sysctl {name}=...), {fewer}",
            )
    return None


def check_job_fits(nproc: int, log_dir: bool = False) -> Needs:
    """Raise UsageError (exit 2) if a job of `nproc` ranks cannot fit the limits; its needs."""
    needs = job_needs(nproc, log_dir)
    error = job_does_not_fit(nproc, needs, read_limits())
    if error is not None:
        raise error
    return needs
