"""Process trees from /proc: what a rank left behind, when no cgroup can hold it.

Without a cgroup, a rank is its process group (the watcher forks it with
setpgid, gpulaunch/base/procs.py) plus whatever it started; a daemon that
left the group with setsid(2) is found by parentage instead: the watcher is a
child subreaper (prctl(2)), so an orphan comes back to it rather than to init.
One read of /proc per event (a stop, a process gone), never a polling loop.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Proc:
    """One process as /proc/PID/stat shows it."""

    pid: int
    ppid: int
    pgid: int
    zombie: bool


def _stat(pid: int) -> Proc | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None  # gone meanwhile
    # "pid (comm) state ppid pgrp ...": comm may hold spaces and parentheses.
    fields = text[text.rfind(")") + 2 :].split()
    return Proc(pid=pid, ppid=int(fields[1]), pgid=int(fields[2]), zombie=fields[0] in "ZX")


def processes() -> list[Proc]:
    """Every process we can see."""
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            proc = _stat(int(name))
            if proc is not None:
                out.append(proc)
    return out


def descendants(roots: Iterable[int], pgids: Collection[int], skip: Collection[int]) -> list[Proc]:
    """Processes below `roots` (by parentage), or in one of `pgids`, but not below `skip`.

    `roots` are the watcher (whose adopted orphans are its children) and every
    rank; `skip` the processes that are none of the ranks' (the log pumps, the
    peer) and their subtrees.
    """
    procs = processes()
    children: dict[int, list[Proc]] = {}
    for proc in procs:
        children.setdefault(proc.ppid, []).append(proc)
    found: dict[int, Proc] = {}
    stack = list(roots)
    while stack:
        for child in children.get(stack.pop(), ()):
            if child.pid in skip or child.pid in found:
                continue
            found[child.pid] = child
            stack.append(child.pid)
    for proc in procs:
        if proc.pgid in pgids and proc.pid not in skip and proc.pid != os.getpid():
            found.setdefault(proc.pid, proc)
    return list(found.values())


def signal_all(procs: Iterable[Proc], signum: int) -> None:
    """Send `signum` to each live process (gone ones are skipped)."""
    for proc in procs:
        if not proc.zombie:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(proc.pid, signum)


def reap_adopted(procs: Iterable[Proc], ours: Collection[int]) -> None:
    """Collect the exit of every adopted orphan that ended (not the watcher's own children)."""
    me = os.getpid()
    for proc in procs:
        if proc.ppid == me and proc.pid not in ours:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(proc.pid, os.WNOHANG)


def reap_orphans(ours: Collection[int]) -> None:
    """Collect every adopted orphan that ended while the job runs (a subreaper must wait(2)
    for what it adopts, prctl(2), or each stays a zombie until the watcher exits).

    Not the watcher's own children (`ours`), nor what it ran itself (a `subprocess`
    child, in the watcher's own process group, which that call waits for): a rank
    and what it starts are in a rank's group or a session of their own.
    """
    me, group = os.getpid(), os.getpgid(0)
    for proc in processes():
        if proc.ppid == me and proc.zombie and proc.pid not in ours and proc.pgid != group:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(proc.pid, os.WNOHANG)
