"""The watcher's own watch on its front end, until the front end owns its bus name.

The front end's bus name ties the watcher's service to the front end's life
(`Type=dbus`, `BusName=`), but only once the front end owns it, which it can do only
after the service reached its start state (frontend/unit.py). A front end killed in
between left the service `activating`, the job running detached until
`TimeoutStartSec=` (90 s; issue 22, item 12). So the front end also hands its
watcher its identity (pid and start time, in `GPULAUNCH_FRONTEND`), and the
watcher holds a pidfd of it from its first moment: when the front end ends, the
watcher asks the user manager to stop its own service, which is what the name's
end does (a SIGTERM to the watcher: the job stops gracefully and is recorded).
Where the name's end came first, the two stops are one.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable

from gpulaunch.model import JobProgress, JobReport, JobSpec, Manager, RankProgress
from gpulaunch.parts import Controls, Part

ENV = "GPULAUNCH_FRONTEND"  # "<pid>:<start time>" of the front end (start.py takes it out)
# ... and this after it: no bus name ties us to it (no user bus), a tie service does; no
# tether then, but a SIGTERM with its end is still its death (watcher/launcher.py)
UNTIED = ":untied"


def identity(pid: int) -> str:
    """A process's pid and start time: the pid alone may be someone else's by the time."""
    return f"{pid}:{_start_time(pid)}"


def _start_time(pid: int) -> str:
    try:
        stat = open(f"/proc/{pid}/stat", encoding="ascii", errors="replace").read()  # noqa: SIM115
    except OSError:
        return ""
    return stat.rpartition(")")[2].split()[19]  # field 22, after the command's name


class FrontEndTether(Part):
    """A job `Part` (gpulaunch/parts.py): stops the watcher's service when its front end ends."""

    def __init__(self, front_end: str, stop_service: Callable[[], None]) -> None:
        self._stop_service = stop_service
        self._loop: asyncio.AbstractEventLoop | None = None
        self.pidfd = -1
        pid, _, started = front_end.partition(":")
        with contextlib.suppress(OSError, ValueError):
            pidfd = os.pidfd_open(int(pid))
            if started and _start_time(int(pid)) == started:
                self.pidfd = pidfd
            else:  # gone already, its pid someone else's
                os.close(pidfd)

    def attach(self, job: JobProgress, controls: Controls, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        if self.pidfd < 0:
            self._ended()
        else:
            loop.add_reader(self.pidfd, self._ended)

    def _ended(self) -> None:
        self._release()
        with contextlib.suppress(Exception):  # a stop on its way, or no manager to ask
            self._stop_service()

    def _release(self) -> None:
        if self.pidfd >= 0:
            if self._loop is not None:
                self._loop.remove_reader(self.pidfd)
            os.close(self.pidfd)
            self.pidfd = -1

    def changed(self, job: JobProgress, rank: RankProgress | None) -> None:
        pass

    async def finished(self, job: JobProgress, report: JobReport) -> None:
        self._release()


def tether_observers(front_end: str | None, spec: JobSpec) -> tuple[FrontEndTether, ...]:
    """Under a front end: the watch on its life until its bus name holds us (FrontEndTether)."""
    if not front_end or front_end.endswith(UNTIED):
        return ()

    def stop_service() -> None:
        from gpulaunch.supervisor.systemd_api import Systemd

        with Systemd(Manager.USER) as systemd:
            systemd.stop_unit(spec.names.launch_service)

    return (FrontEndTether(front_end, stop_service),)
