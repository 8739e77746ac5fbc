"""Whether a SIGTERM to the watcher is its launcher's death, not a stop someone asked for.

The process the user started may not be the watcher: the direct supervisor's keeper is
its parent (supervisor/keeper.py: a keeper SIGKILLed sends the watcher SIGTERM by
PR_SET_PDEATHSIG), and an ordinary user's front end starts it as a service
(frontend/tether.py: a front end that ends stops that service, a SIGTERM). Either way
the job stops as on a SIGTERM, and its report and record say what happened: "stopped
by the death of its launcher (pid N)", not "stopped by SIGTERM", which reads as a
`kill` someone sent. The launcher is known by its identity (jobapi/procid.py), so a
reused pid is never taken for it.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from dataclasses import dataclass

from gpulaunch.jobapi.procid import Identity, boot_id, pid_namespace


@dataclass(frozen=True)
class Launcher:
    """The process whose death stops the job with a SIGTERM to the watcher."""

    identity: Identity

    def why(self, signum: int) -> str | None:
        """What interrupted the job, if this signal came with the launcher's death."""
        if signum != signal.SIGTERM or (self.identity.alive() and not _exiting(self.identity)):
            return None
        return f"the death of its launcher (pid {self.identity.pid})"


PF_EXITING = 0x4  # include/linux/sched.h: set first thing in do_exit()


def _exiting(identity: Identity) -> bool:
    """Whether it is on its way out: its sockets close (its bus name goes, and systemd stops
    the watcher) before it is a zombie (proc(5): /proc/PID/stat field 9, the flags)."""
    try:
        with open(f"/proc/{identity.pid}/stat") as f:
            flags = int(f.read().rsplit(")", 1)[1].split()[6])
    except (OSError, IndexError, ValueError):
        return True  # gone
    return bool(flags & PF_EXITING)


def launcher_of(keeper: int | None, front_end: str | None) -> Launcher | None:
    """The front end ("pid:start[:untied]", frontend/tether.py), else the keeper (its pid:
    our parent, now), else None."""
    if front_end:
        pid, _, start = front_end.partition(":")
        start = start.partition(":")[0]
        if pid.isdigit() and start.isdigit():
            return Launcher(Identity(int(pid), int(start), boot_id(), pid_namespace()))
    identity = Identity.of(keeper) if keeper else None
    return None if identity is None else Launcher(identity)


def why_signalled(keeper: int | None, front_end: str | None) -> Callable[[int], str | None]:
    """What a signal to the watcher was, if not a stop someone asked for (None: a stop)."""
    launcher = launcher_of(keeper, front_end)
    return launcher.why if launcher is not None else lambda signum: None
