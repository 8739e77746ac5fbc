"""The machine a run happened on, and how busy other work kept it meanwhile.

Benchmarks on a shared 2-CPU machine are only as good as its quiet: `CpuMeter` tells
the CPU the whole machine used (/proc/stat, not namespaced) from the CPU of this run
(this process and everything it reaped: launchers, ranks, helpers, journalctl) and of
the box's systemd, dbus-daemon and journald. The rest is other work.
"""

from __future__ import annotations

import os
import platform
import resource
import subprocess
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from bench import procs

REPO = Path(__file__).resolve().parents[1]
IN_BOX = "BENCH_IN_SDBOX"  # set by `python -m bench` when it re-runs itself in a box
BOX_HELPERS = ("systemd", "dbus-daemon", "systemd-journal", "systemd-logind")


def loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "unknown"


def command(*argv: str) -> str:
    """The first line a command prints, or "unknown"."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, check=False, cwd=REPO)
    except OSError:
        return "unknown"
    return done.stdout.strip().splitlines()[0] if done.stdout.strip() else "unknown"


def describe() -> dict[str, Any]:
    mem_kib = 0
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            mem_kib = int(line.split()[1])
    os_name = "unknown"
    for line in Path("/etc/os-release").read_text().splitlines():
        if line.startswith("PRETTY_NAME="):
            os_name = line.split("=", 1)[1].strip('"')
    commit = command("git", "rev-parse", "--short", "HEAD")
    dirty = command("git", "status", "--porcelain", "--", "gpulaunch") != "unknown"
    return {
        "CPUs": os.cpu_count(),
        "memory": f"{mem_kib / 1024 / 1024:.1f} GiB",
        "OS": os_name,
        "kernel": platform.release(),
        "Python": platform.python_version(),
        "torch": metadata.version("torch"),
        "gpulaunch": f"{metadata.version('gpulaunch')}, commit {commit}"
        + (" with uncommitted changes in gpulaunch/" if dirty else ""),
        "systemd": command("systemctl", "--version"),
        "where": "inside the project's systemd box (sdbox)"
        if os.environ.get(IN_BOX)
        else "under the host's systemd",
        "load average at the start": loadavg(),
    }


@dataclass(frozen=True)
class CpuReading:
    at: float  # seconds of CLOCK_MONOTONIC
    machine_s: float  # busy CPU seconds of the whole machine
    ours_s: float  # this process and its reaped descendants
    box_s: float  # the box's systemd and friends


def _machine_busy() -> float:
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    # user nice system idle iowait irq softirq steal ...: busy is all but idle and iowait
    values = [int(v) for v in fields[:8]]
    return (sum(values) - values[3] - values[4]) / procs.CLK_TCK


def read_cpu() -> CpuReading:
    self_ = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    ours = self_.ru_utime + self_.ru_stime + children.ru_utime + children.ru_stime
    box = procs.cpu_of(procs.pids_by_comm(*BOX_HELPERS))
    return CpuReading(os.times().elapsed, _machine_busy(), ours, box)


def other_load(before: CpuReading, after: CpuReading) -> tuple[float, float]:
    """CPU seconds other work used between two readings, and its share of the machine."""
    machine = after.machine_s - before.machine_s
    ours = (after.ours_s - before.ours_s) + max(after.box_s - before.box_s, 0.0)
    other = max(machine - ours, 0.0)
    capacity = (after.at - before.at) * (os.cpu_count() or 1)
    return other, other / capacity if capacity > 0 else 0.0
