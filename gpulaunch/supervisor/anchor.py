"""The job's anchor: a process systemd itself starts, which lives as long as the watcher.

Why it exists (issue 13, item 4): a scope is started for processes someone
else forked, with `PIDs=`. If the watcher is SIGKILLed after asking for its
scope but before systemd moved it there, the watcher is a zombie when the
start job runs: systemd "moves" it without error, and the scope stays
`active (running)` with an empty cgroup, for good, and the job slice with it.
No property of a scope or a slice removes that (an empty cgroup that never
was populated sends no event; `RuntimeMaxSec=` of a scope cannot be changed
once it runs, systemd 252).

So the first call of a job creates, at once (one `StartTransientUnit`, the job
slice as its auxiliary unit): the job slice and `gpulaunch-<JOB>-anchor.service`
in it, a service whose process systemd forks (so it is never empty), which
waits for the watcher's pid to end and then exits. The service carries
`PropagatesStopTo=` the job slice: when it ends, systemd stops the job slice
and everything in it (the watcher scope, empty or not, and the ranks). A
watcher killed at any instant leaves either nothing (killed before that call)
or an anchor that sees it gone and takes the job down. Later units are created
inside the slice and go with it.
"""

from __future__ import annotations

import sys

from gpulaunch.units.codec import Property

# Runs under `python3 -I -S`: waits for pid argv[1] (whose start time is argv[2],
# against pid reuse) to end. No imports beyond the built-in os and select.
PROGRAM = """\
import os, select, sys
pid, start = int(sys.argv[1]), sys.argv[2]
try:
    fd = os.pidfd_open(pid)
    with open(f"/proc/{pid}/stat") as f:
        alive = f.read().rsplit(")", 1)[1].split()[19] == start
except OSError:
    alive = False
if alive:
    select.select([fd], [], [])
"""


def start_time(pid: int) -> str:
    """The process's start time in clock ticks since boot (/proc/PID/stat, field 22)."""
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[19]


def properties(job_slice: str, description: str, watcher_pid: int) -> tuple[Property, ...]:
    """The anchor service's properties (systemd.service(5), systemd.unit(5))."""
    argv = [sys.executable, "-I", "-S", "-c", PROGRAM, str(watcher_pid), start_time(watcher_pid)]
    return (
        Property("Description", "s", f"{description}: anchor"),
        Property("Slice", "s", job_slice),
        # Its end (the watcher's end) stops the job slice and everything in it.
        Property("PropagatesStopTo", "as", [job_slice]),
        Property("CollectMode", "s", "inactive-or-failed"),
        Property("ExecStart", "a(sasb)", [(sys.executable, argv, False)]),
        Property("WorkingDirectory", "s", "/"),
        Property("StandardInput", "s", "null"),
        Property("StandardOutput", "s", "null"),
        Property("StandardError", "s", "journal"),
    )


def anchor_name(job_slice: str) -> str:
    """gpulaunch-<JOB>.slice -> gpulaunch-<JOB>-anchor.service."""
    return job_slice.removesuffix(".slice") + "-anchor.service"
