"""A rank's cgroup (v2) as files: where it is, its processes, CPU and memory counters.

Every function takes the roots it reads (`/proc`, `/sys/fs/cgroup`) so that the
unit tests can hand it a fake tree. A counter the kernel does not offer here
(no memory controller: no `memory.current`, `memory.peak`, `memory.events`)
reads as None, never as 0.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

PROC = Path("/proc")
CGROUP_ROOT = Path("/sys/fs/cgroup")


def unified_path(text: str) -> str | None:
    """The cgroup v2 path in a `/proc/PID/cgroup` text (its `0::` line), as written there.

    The one parser of that file. In a cgroup namespace the path is relative to the
    namespace's root; `/..` means outside our view.
    """
    for line in text.splitlines():
        if line.startswith("0::"):
            return line[3:].strip()
    return None


def proc_cgroup(pid: int | str = "self", proc: Path = PROC) -> str | None:
    """`unified_path` of a process (`self`: this one); None if it is gone or has none."""
    try:
        return unified_path((proc / str(pid) / "cgroup").read_text())
    except OSError:
        return None


def cgroup_of(pid: int | str, proc: Path = PROC, root: Path = CGROUP_ROOT) -> Path | None:
    """The cgroup v2 directory of a live process (its `0::` line), or None if it is gone.

    A zombie's `/proc/PID/cgroup` no longer names its unit: read it while it runs.
    """
    rel = proc_cgroup(pid, proc)
    if rel is None or not rel.startswith("/") or "/.." in rel:
        return None
    return root / rel.lstrip("/")


def procs(cgroup: Path) -> list[int]:
    """Every process of the cgroup (`cgroup.procs`); [] once it is gone."""
    try:
        return [int(x) for x in (cgroup / "cgroup.procs").read_text().split()]
    except (OSError, ValueError):
        return []


def _keyed(path: Path) -> dict[str, int] | None:
    """A flat keyed file (`cpu.stat`, `memory.events`): {key: value}, None if absent."""
    try:
        text = path.read_text()
    except OSError:
        return None
    out = {}
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        with contextlib.suppress(ValueError):
            out[key] = int(value)
    return out


def _number(path: Path) -> int | None:
    """A single-value file (`memory.current`, `memory.max`); None if absent or `max`."""
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def cpu_usec(cgroup: Path) -> int | None:
    """CPU time of every process the cgroup ever held (`cpu.stat` usage_usec).

    cgroup v2 keeps `cpu.stat` without the cpu controller, so this is there
    wherever the unified hierarchy is.
    """
    stat = _keyed(cgroup / "cpu.stat")
    return None if stat is None else stat.get("usage_usec")


def memory_current(cgroup: Path) -> int | None:
    return _number(cgroup / "memory.current")


def memory_peak(cgroup: Path) -> int | None:
    """`memory.peak` (Linux 5.19+, with the memory controller)."""
    return _number(cgroup / "memory.peak")


def memory_max(cgroup: Path) -> int | None:
    """The cgroup's own `memory.max`; None where unlimited or no controller."""
    return _number(cgroup / "memory.max")


def memory_limit(cgroup: Path, root: Path = CGROUP_ROOT) -> int | None:
    """The `memory.max` that bounds the cgroup: its own, else its nearest ancestor's
    (`--job-memory-max` is the job slice's); None where nothing below root limits it."""
    own = memory_max(cgroup)
    if own is not None:
        return own
    for group in cgroup.parents:
        if group == root or root not in group.parents:
            return None
        found = memory_max(group)
        if found is not None:
            return found
    return None


def oom_kills(cgroup: Path) -> int | None:
    """`oom_kill` of `memory.events` (kills by any OOM killer of this cgroup's processes)."""
    events = _keyed(cgroup / "memory.events")
    return None if events is None else events.get("oom_kill", 0)


def memory_controller(cgroup: Path) -> str | None:
    """Why `memory.current` cannot be read here, or None when it can."""
    if (cgroup / "memory.current").exists():
        return None
    parent = cgroup.parent
    try:
        enabled = (parent / "cgroup.subtree_control").read_text().split()
    except OSError:
        enabled = []
    if "memory" in enabled:
        return None  # it should be there: the cgroup has just gone
    return "the memory controller is not enabled for this cgroup (no memory.current)"
