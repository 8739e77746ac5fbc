"""What each live rank uses now, read cheaply at every scrape: the rank's cgroup
(`cpu.stat`, `memory.current`, `cgroup.procs`), its processes' resident memory
(`/proc/PID/statm`) and, where NVML is there, its processes' GPU memory and SM use.

The same sources as `gpulaunch status --resources` (resources/sample.py), without what
costs: no psutil, no `smaps_rollup` (PSS). A rank without a cgroup of its own (the
direct supervisor's process groups share the watcher's) gets no cgroup numbers: they
would be the watcher's and every other rank's too.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from gpulaunch.base import cgroup as cg
from gpulaunch.model import RankProgress
from gpulaunch.resources.nvml import GpuProcess, Gpus, gpu_use

PAGE = os.sysconf("SC_PAGE_SIZE")


@dataclass(frozen=True)
class RankUse:
    """One rank at one scrape; None where this machine cannot tell."""

    cpu_seconds: float | None = None
    memory: int | None = None  # bytes, the cgroup's memory.current
    rss: int | None = None  # bytes, resident memory of its processes
    processes: int | None = None
    gpu_memory: int | None = None  # bytes
    gpu_util: int | None = None  # percent of SMs, summed over its processes


class UsageReader:
    """Reads the ranks; a rank's cgroup is looked up once per pid."""

    def __init__(
        self, gpus: Gpus | None = None, proc: Path = cg.PROC, root: Path = cg.CGROUP_ROOT
    ) -> None:
        self.gpus = gpus
        self.proc = proc
        self.root = root
        self._cgroups: dict[int, Path | None] = {}  # pid -> its cgroup, None: shared

    def read(self, ranks: Sequence[RankProgress], watcher_pid: int) -> dict[int, RankUse]:
        """Every live rank's use, by rank."""
        live = [r for r in ranks if r.pid and r.state.alive]
        on_gpu = self.gpus.processes() if self.gpus is not None and live else {}
        self._cgroups = {r.pid: self._cgroups[r.pid] for r in live if r.pid in self._cgroups}
        return {r.rank: self._rank(r.pid, watcher_pid, on_gpu) for r in live if r.pid}

    def _cgroup(self, pid: int, watcher_pid: int) -> Path | None:
        if pid not in self._cgroups:
            group = cg.cgroup_of(pid, self.proc, self.root)
            shared = group is not None and group == cg.cgroup_of(watcher_pid, self.proc, self.root)
            self._cgroups[pid] = None if shared else group
        return self._cgroups[pid]

    def _rank(self, pid: int, watcher_pid: int, on_gpu: dict[int, list[GpuProcess]]) -> RankUse:
        group = self._cgroup(pid, watcher_pid)
        if group is None:
            return RankUse()
        pids = cg.procs(group)
        usec = cg.cpu_usec(group)
        rss = [self._rss(p) for p in pids]
        gpu_memory, gpu_util = gpu_use(pids, on_gpu)
        known = [n for n in rss if n is not None]
        return RankUse(
            cpu_seconds=None if usec is None else usec / 1e6,
            memory=cg.memory_current(group),
            rss=sum(known) if known else None,
            processes=len(pids) if pids else None,
            gpu_memory=gpu_memory,
            gpu_util=gpu_util,
        )

    def _rss(self, pid: int) -> int | None:
        try:
            return int((self.proc / str(pid) / "statm").read_text().split()[1]) * PAGE
        except (OSError, ValueError, IndexError):
            return None  # gone between cgroup.procs and now

    def close(self) -> None:
        if self.gpus is not None:
            self.gpus.close()
            self.gpus = None
