"""The hang detector's logic (--hang-timeout): pure decisions over times and CPU counters.

A job hangs when, for `timeout` seconds while it runs, no rank wrote output
and no rank used measurable CPU (more than `CPU_SHARE` of one CPU). Output
times come from the watcher's output (logs/output.py sees every byte); CPU
times are read when a check is due (`cpu_seconds`: the rank's cgroup
`cpu.stat`, which counts every process of its unit, else /proc/PID/stat). A
check is due at the latest half a timeout after the previous one, so a hang is
found between `timeout` and 1.5 x `timeout` after the last sign of life.

Which collective each rank waits in comes from its stacks (debug/stacks.py):
the innermost frame of torch.distributed's collectives in its main thread, and the
line of the rank's own code that called it. The same for every backend: gloo and the
CPU have no trace buffer, and NCCL's (torch's flight recorder) is written by the rank
itself, at its own timeout, long after ours (README.md, "Hangs").
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gpulaunch.base.cgroup import cgroup_of
from gpulaunch.debug.stacks import RankStacks

CPU_SHARE = 0.01  # "measurable": more than 1 % of one CPU over the interval
COLLECTIVES = frozenset(
    {
        "all_reduce",
        "all_reduce_coalesced",
        "all_gather",
        "all_gather_into_tensor",
        "all_gather_object",
        "all_to_all",
        "all_to_all_single",
        "barrier",
        "monitored_barrier",
        "broadcast",
        "broadcast_object_list",
        "gather",
        "gather_object",
        "reduce",
        "reduce_scatter",
        "reduce_scatter_tensor",
        "scatter",
        "scatter_object_list",
        "send",
        "recv",
        "wait",  # a Work's wait() after an async collective
    }
)


@dataclass
class HangClock:
    """Decides, check by check, whether the job has shown no sign of life for `timeout`."""

    timeout: float
    started: float  # when the ranks started running
    _last_cpu: dict[int, float] = field(default_factory=dict)
    _last_check: float | None = None
    _cpu_active: float = 0.0  # the latest check that saw a rank use CPU

    def check(self, now: float, last_output: float, cpu: Mapping[int, float]) -> float | None:
        """None: hung. Else when to check next."""
        if self._last_check is not None:
            interval = max(now - self._last_check, 1e-9)
            for rank, seconds in cpu.items():
                if seconds - self._last_cpu.get(rank, seconds) > CPU_SHARE * interval:
                    self._cpu_active = now
        self._last_check = now
        self._last_cpu = dict(cpu)
        quiet_since = max(self.started, last_output, self._cpu_active)
        if now - quiet_since >= self.timeout:
            return None
        return min(quiet_since + self.timeout, now + self.timeout / 2)


def cpu_seconds(pid: int) -> float | None:
    """CPU time of the unit `pid` is in (cgroup v2 cpu.stat), else of `pid` alone; None: gone."""
    try:
        cgroup = cgroup_of(pid)
        if cgroup is not None:
            for line in (cgroup / "cpu.stat").read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "usage_usec":
                    return int(value) / 1e6
    except (OSError, ValueError):
        pass
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def collective_of(stacks: RankStacks) -> str | None:
    """The torch.distributed collective the rank's main thread is in, if any."""
    thread = stacks.main_thread()
    if thread is None:
        return None
    for frame in thread.frames:
        name = frame.name.rsplit(".", 1)[-1]
        if name in COLLECTIVES and "torch/distributed" in frame.filename.replace(os.sep, "/"):
            return name
    return None


def where(stacks: RankStacks) -> str:
    """The innermost frame of the rank's main thread outside the standard library and torch."""
    thread = stacks.main_thread()
    if thread is None or not thread.frames:
        return "unknown"
    for frame in thread.frames:
        if "/torch/" not in frame.filename and "/lib/python3" not in frame.filename:
            return frame.describe()
    return thread.frames[0].describe()


def hang_summary(stacks: Sequence[RankStacks]) -> str:
    """`ranks 0, 2, 3 in all_reduce called from main (train.py:30); rank 1 not in a collective:
    elsewhere (train.py:12)`.

    Ranks are grouped by collective and by the call of their own code that entered it
    (`where`): ranks in the same collective entered from different lines wait in different
    calls, each group for a call the other never makes (a mismatch, not a slow rank).
    """
    waiting: dict[tuple[str, str], list[int]] = {}
    others: list[RankStacks] = []
    for s in stacks:
        collective = collective_of(s)
        if collective is None:
            others.append(s)
        else:
            waiting.setdefault((collective, where(s)), []).append(s.rank)
    parts = [
        f"{_ranks(ranks)} in {name} called from {site}"
        for (name, site), ranks in sorted(waiting.items(), key=lambda kv: kv[1])
    ]
    for s in others:
        if s.error is not None:
            parts.append(f"rank {s.rank}: no stacks ({s.error})")
        else:
            parts.append(f"rank {s.rank} not in a collective: {where(s)}")
    return "; ".join(parts)


def _ranks(ranks: list[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))
