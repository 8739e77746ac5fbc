"""What a rank used over its life, and whether the OOM killer ended it: read by the
watcher when the rank's main process has exited, before it is reaped.

Where each number comes from (the report says it once):

- CPU time: the unit's cgroup `cpu.stat` usage_usec (every process the rank's
  scope held: the rank, its children, its log pump), which cgroup v2 keeps
  without any controller; else the rank's own rusage from `wait4` (it and the
  children it waited for).
- peak memory: the cgroup's `memory.peak` (Linux 5.19+ with the memory
  controller); else `wait4`'s `ru_maxrss`, the peak RSS of the rank's largest
  process (its own or a child it waited for), not of the whole unit.
- GPU memory: NVML's accounting of the unit's processes, where accounting mode is on.
- OOM: `oom_kill` in the cgroup's `memory.events` (any OOM killer: the rank's
  `--memory-max`, the job's, the machine's); without the memory controller, a
  "Killed process PID" line of the kernel log (`/dev/kmsg`, else `dmesg`) for the
  rank's pid. The kernel logs its own pids: inside a PID namespace other than
  the kernel's (a container) they differ, and a kill found only in the log is missed.
"""

from __future__ import annotations

import contextlib
import os
import re
import resource
import signal
import subprocess
from collections.abc import Callable, Iterable
from pathlib import Path

from gpulaunch.base import cgroup as cg
from gpulaunch.base.procs import HeldChild, WaitStatus, reap_with_usage
from gpulaunch.model import JobSpec, OomKill, RankUsage
from gpulaunch.resources.nvml import Gpus
from gpulaunch.units.values import parse_size

CPU_FROM_CGROUP = "the unit's cgroup (cpu.stat)"
CPU_FROM_WAIT4 = "wait4 (the rank and the children it waited for)"
PEAK_FROM_CGROUP = "the unit's cgroup (memory.peak)"
PEAK_FROM_WAIT4 = "wait4's ru_maxrss (the rank's largest process; no memory.peak here)"
FROM_EVENTS = "memory.events"
FROM_KERNEL_LOG = "the kernel log"

_KILLED = re.compile(
    r"Killed process (?P<pid>\d+) \((?P<comm>[^)]*)\).*?anon-rss:(?P<anon>\d+)kB, "
    r"file-rss:(?P<file>\d+)kB, shmem-rss:(?P<shmem>\d+)kB"
)


def usage(group: Path | None, rusage: resource.struct_rusage, gpu_memory: int | None) -> RankUsage:
    """The rank's CPU time and peak memory, from its cgroup where it has them."""
    usec = cg.cpu_usec(group) if group is not None else None
    peak = cg.memory_peak(group) if group is not None else None
    return RankUsage(
        cpu_sec=usec / 1e6 if usec is not None else rusage.ru_utime + rusage.ru_stime,
        cpu_source=CPU_FROM_CGROUP if usec is not None else CPU_FROM_WAIT4,
        peak_memory=peak if peak is not None else rusage.ru_maxrss * 1024,
        peak_source=PEAK_FROM_CGROUP if peak is not None else PEAK_FROM_WAIT4,
        gpu_memory=gpu_memory,
    )


def oom_kill(
    group: Path | None,
    pid: int,
    signum: int | None,
    limit: int | None,
    kernel_log: Callable[[], Iterable[str]] | None = None,
) -> OomKill | None:
    """The OOM kill of a rank that died by SIGKILL, or None.

    `limit` is what the job asked for (`--memory-max`, bytes) when the cgroup
    does not say its own `memory.max`.
    """
    if signum != signal.SIGKILL:
        return None
    if group is not None:
        kills = cg.oom_kills(group)
        if kills is not None:
            if kills == 0:
                return None
            return OomKill(
                memory=cg.memory_peak(group),
                limit=cg.memory_limit(group) or limit,
                source=FROM_EVENTS,
            )
    for line in (kernel_log or read_kernel_log)():
        found = _KILLED.search(line)
        if found and int(found["pid"]) == pid:
            rss = sum(int(found[k]) for k in ("anon", "file", "shmem")) * 1024
            return OomKill(memory=rss, limit=limit, source=FROM_KERNEL_LOG)
    return None


def read_kernel_log() -> list[str]:
    """The kernel's ring buffer as lines: /dev/kmsg (each read is one record), else dmesg."""
    lines: list[str] = []
    try:
        fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        fd = -1
    if fd >= 0:
        try:
            while True:
                try:
                    record = os.read(fd, 8192)
                except BlockingIOError:
                    break
                except BrokenPipeError:  # a record was overwritten while we read: go on
                    continue
                if not record:
                    break
                lines.append(record.decode(errors="replace").split(";", 1)[-1])
        finally:
            os.close(fd)
        return lines
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        res = subprocess.run(
            ["dmesg"], capture_output=True, text=True, errors="replace", timeout=5, check=False
        )
        lines = res.stdout.splitlines()
    return lines


def requested_limit(memory_max: str | None) -> int | None:
    """`--memory-max` in bytes where it is a size (not a percentage or `infinity`)."""
    if memory_max is None:
        return None
    try:
        return parse_size(memory_max)
    except Exception:  # InvalidValue: a percentage, infinity
        return None


class UsageReader:
    """The watcher's reader of ranks' usage at their end; NVML only for jobs with GPUs."""

    def __init__(self, spec: JobSpec, gpus: Gpus | str | None = None) -> None:
        self._with_gpus = any(r.gpu is not None for r in spec.ranks)
        self._gpus = gpus
        self._limit = requested_limit(spec.memory_max)

    def reap(
        self, child: HeldChild, group: Path | None
    ) -> tuple[WaitStatus, RankUsage, OomKill | None]:
        """Reap a rank whose pidfd said it exited: its status, usage and OOM kill.

        `group` is its scope's cgroup (still there: its log pump outlives it).
        """
        status, rusage = reap_with_usage(child)
        pid = child.pid
        gpu = self.gpu_peak([pid, *(cg.procs(group) if group is not None else ())])
        return (
            status,
            usage(group, rusage, gpu),
            oom_kill(group, pid, status.signal, self._limit),
        )

    def gpu_peak(self, pids: Iterable[int]) -> int | None:
        if not self._with_gpus:
            return None
        if self._gpus is None:
            from gpulaunch.resources.nvml import open_gpus

            self._gpus = open_gpus()
        return self._gpus.peak_memory(pids) if isinstance(self._gpus, Gpus) else None

    def close(self) -> None:
        if isinstance(self._gpus, Gpus):
            self._gpus.close()
