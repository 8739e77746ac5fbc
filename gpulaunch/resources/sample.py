"""One look at every rank of a job: CPU, memory, processes, GPU, its last output line.

A rank's processes are those of its unit: `cgroup.procs` of the cgroup its pid
is in (its log pump included), read with psutil. CPU time is the cgroup's
`cpu.stat` (every process the unit ever held, also those already gone); CPU %
is its growth between two looks divided by the wall time between them (100 %
is one CPU). Numbers this machine cannot give are None, and `JobSample.missing`
says once, per column, why.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from gpulaunch.base import cgroup as cg
from gpulaunch.resources.nvml import GpuProcess, Gpus, gpu_use

LIVE_STATES = ("held", "running")


@dataclass(frozen=True)
class RankTarget:
    """What the job's view on the bus says of a rank."""

    rank: int
    unit: str
    pid: int  # 0: not forked yet
    state: str
    last_output: float | None = None  # seconds since the epoch of its last line; None: none yet
    watcher_pid: int = 0  # a rank in the watcher's own cgroup has none of its own (below)


@dataclass(frozen=True)
class RankSample:
    """One rank (or, `rank` None, the job's totals) at one look."""

    rank: int | None
    unit: str
    state: str
    cpu_percent: float | None = None
    cpu_sec: float | None = None
    rss: int | None = None
    pss: int | None = None
    cgroup_memory: int | None = None
    processes: int | None = None
    threads: int | None = None
    gpu_memory: int | None = None
    gpu_util: int | None = None
    idle_sec: float | None = None  # seconds since its last output line

    def to_json(self) -> dict[str, object]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


# The columns that can be missing on a machine, with the text that heads them.
COLUMNS = {
    "cgroup_memory": "memory.current",
    "pss": "PSS",
    "gpu": "GPU",
    "idle_sec": "last output",
}


@dataclass(frozen=True)
class JobSample:
    """Every rank and the totals; `missing`: column -> why it cannot be had here."""

    ranks: tuple[RankSample, ...]
    total: RankSample
    missing: dict[str, str] = field(default_factory=dict)
    interval: float | None = None  # seconds the CPU % were measured over

    def to_json(self) -> dict[str, object]:
        return {
            "ranks": [r.to_json() for r in self.ranks],
            "total": self.total.to_json(),
            "missing": dict(self.missing),
            "cpu_interval_sec": self.interval,
        }


@dataclass
class _Processes:
    rss: int = 0
    pss: int | None = 0
    threads: int = 0
    count: int = 0
    cpu_sec: float = 0.0
    pids: list[int] = field(default_factory=list)


class Sampler:
    """Looks at ranks again and again; CPU % comes from the previous look at each unit."""

    def __init__(
        self,
        gpus: Gpus | str | None = None,
        proc: Path = cg.PROC,
        root: Path = cg.CGROUP_ROOT,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.gpus = gpus
        self.proc = proc
        self.root = root
        self.clock = clock
        self.wall = wall
        self._previous: dict[str, tuple[float, float]] = {}  # unit -> (clock, cpu seconds)

    def sample(
        self, targets: Sequence[RankTarget], last_output_missing: str | None = None
    ) -> JobSample:
        """One look at the ranks; `last_output_missing`: why the job does not tell each rank's
        last output (None: it does)."""
        missing: dict[str, str] = {}
        now, wall = self.clock(), self.wall()
        on_gpu = self.gpus.processes() if isinstance(self.gpus, Gpus) else {}
        if isinstance(self.gpus, str):
            missing["gpu"] = self.gpus
        elif self.gpus is None:
            missing["gpu"] = "not asked for"
        if last_output_missing is not None:
            missing["idle_sec"] = last_output_missing
        ranks = []
        intervals: list[float] = []
        for t in targets:
            ranks.append(self._rank(t, now, wall, on_gpu, missing, intervals))
        total = _total(ranks)
        if not any(r.gpu_memory is not None or r.gpu_util is not None for r in ranks):
            if "gpu" not in missing and isinstance(self.gpus, Gpus):
                missing["gpu"] = (
                    "NVML names the processes on a GPU by the host's pids, which this pid "
                    "namespace (a container) cannot see"
                    if on_gpu and nested_pid_namespace()
                    else "no process of these ranks is on a GPU"
                )
        return JobSample(
            ranks=tuple(ranks),
            total=total,
            missing=missing,
            interval=max(intervals) if intervals else None,
        )

    def _rank(
        self,
        t: RankTarget,
        now: float,
        wall: float,
        on_gpu: dict[int, list[GpuProcess]],
        missing: dict[str, str],
        intervals: list[float],
    ) -> RankSample:
        idle = None if t.last_output is None else max(0.0, wall - t.last_output)
        alive = t.pid and t.state in LIVE_STATES
        group = cg.cgroup_of(t.pid, self.proc, self.root) if alive else None
        if group is None:
            return RankSample(rank=t.rank, unit=t.unit, state=t.state, idle_sec=idle)
        if t.watcher_pid and group == cg.cgroup_of(t.watcher_pid, self.proc, self.root):
            # process groups: the cgroup is the watcher's (a login session's, a Slurm step's),
            # shared; the rank's figures are those of its own processes, never the cgroup's
            missing.setdefault("cgroup_memory", SHARED_CGROUP)
            pids = [t.pid, *_descendants(t.pid)]
            group = None
        else:
            pids = cg.procs(group)
        procs = self._processes(pids, missing)
        usec = cg.cpu_usec(group) if group is not None else None
        cpu_sec = usec / 1e6 if usec is not None else procs.cpu_sec
        percent = None
        key = t.unit or f"rank {t.rank}"
        before = self._previous.get(key)
        if before is not None and now > before[0]:
            percent = max(0.0, (cpu_sec - before[1]) / (now - before[0]) * 100)
            intervals.append(now - before[0])
        self._previous[key] = (now, cpu_sec)
        current = cg.memory_current(group) if group is not None else None
        if current is None and group is not None:
            why = cg.memory_controller(group)
            if why:
                missing.setdefault("cgroup_memory", why)
        gpu_memory, gpu_util = gpu_use(procs.pids, on_gpu)
        return RankSample(
            rank=t.rank,
            unit=t.unit,
            state=t.state,
            cpu_percent=percent,
            cpu_sec=cpu_sec,
            rss=procs.rss,
            pss=procs.pss,
            cgroup_memory=current,
            processes=procs.count,
            threads=procs.threads,
            gpu_memory=gpu_memory,
            gpu_util=gpu_util,
            idle_sec=idle,
        )

    @staticmethod
    def _processes(pids: Sequence[int], missing: dict[str, str]) -> _Processes:
        out = _Processes()
        for pid in pids:
            try:
                proc = psutil.Process(pid)
                with proc.oneshot():
                    rss = proc.memory_info().rss
                    threads = proc.num_threads()
                    times = proc.cpu_times()
                    pss: int | None
                    try:
                        pss = proc.memory_full_info().pss  # smaps_rollup: needs ptrace access
                    except (psutil.AccessDenied, AttributeError):
                        pss = None
            except (psutil.NoSuchProcess, psutil.ZombieProcess):
                continue  # gone between cgroup.procs and now
            except psutil.AccessDenied:
                missing.setdefault("pss", "processes of another user (run as root to see them)")
                continue
            out.count += 1
            out.rss += rss
            out.threads += threads
            out.cpu_sec += times.user + times.system
            out.pids.append(pid)
            if pss is None:
                out.pss = None
                missing.setdefault("pss", "smaps_rollup not readable (another user's processes)")
            elif out.pss is not None:
                out.pss += pss
        return out


SHARED_CGROUP = (
    "the ranks share the watcher's cgroup (process groups, no units): each rank's figures "
    "are of its own processes (psutil), none of the shared cgroup's"
)


def _descendants(pid: int) -> list[int]:
    """The pids of a live process's children, grandchildren, ... (psutil)."""
    try:
        return [p.pid for p in psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        return []


def _sum(values: Sequence[float | int | None]) -> float | int | None:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def _total(ranks: Sequence[RankSample]) -> RankSample:
    def total(name: str) -> float | int | None:
        return _sum([getattr(r, name) for r in ranks])

    def whole(name: str) -> int | None:
        value = total(name)
        return None if value is None else int(value)

    idle = [r.idle_sec for r in ranks if r.idle_sec is not None]
    return RankSample(
        rank=None,
        unit="",
        state="",
        cpu_percent=total("cpu_percent"),
        cpu_sec=total("cpu_sec"),
        rss=whole("rss"),
        pss=None if any(r.pss is None and r.rss is not None for r in ranks) else whole("pss"),
        cgroup_memory=whole("cgroup_memory"),
        processes=whole("processes"),
        threads=whole("threads"),
        gpu_memory=whole("gpu_memory"),
        gpu_util=None,
        idle_sec=min(idle) if idle else None,  # the job: since any rank's last line
    )


def measure(
    ranks: Sequence[RankTarget], missing: str | None, sampler: Sampler, interval: float
) -> JobSample:
    """Two looks `interval` seconds apart (the second has CPU %); for one-shot commands.

    `missing`: why the job does not tell each rank's last output (jobapi/targets.py), if so.
    """
    sampler.sample(ranks, missing)
    time.sleep(interval)  # the measuring window of CPU %, not a wait for an event
    return sampler.sample(ranks, missing)


def nested_pid_namespace(root: Path = Path("/")) -> bool:
    """Whether we run in a pid namespace below the host's (`NSpid:` has more than one pid)."""
    try:
        status = (root / "proc/self/status").read_text()
    except OSError:
        return False
    for line in status.splitlines():
        if line.startswith("NSpid:"):
            return len(line.split()) > 2
    return False
