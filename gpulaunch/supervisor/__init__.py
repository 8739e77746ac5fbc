"""Who contains and stops the ranks: the supervisor seam (docs/architecture.md).

The watcher's event loop (gpulaunch/watcher/loop.py) decides *when* ranks start
and stop; a supervisor decides *how* they are contained. The watcher talks to
one small interface, `Supervisor`, and never to systemd itself:

- `create`: make the job's containment, with the watcher (and its peer) inside;
- `place`: put a rank's processes, held at their start gate, into containment
  of their own; the answer comes later, through `SupervisorEvents.placed`,
  because containment may only be in place after the call returned (systemd
  replies to StartTransientUnit before it moves the process);
- `stop_gang`: stop every rank, gracefully (SIGTERM, SIGKILL after the grace);
  `SupervisorEvents.gang_stopped` says when nothing of them is left;
- `kill_gang`: SIGKILL every rank now (a second Ctrl-C);
- `renew_gang`: containment for a new attempt after a gang stop (restarts);
- `signal_rank`: a notice (SIGUSR1/2) to every process of one rank;
- `parent_death_signal`: what the kernel sends the processes the watcher forks
  when it dies (0: nothing; the supervisor stops them another way).
- `catch_up`: hand over every event already under way before the watcher
  judges a rank's unasked death: a rank killed by a stop from outside (for
  systemd, `systemctl stop` of the job's slice) is then known as such
  (`SupervisorEvents.stopped_from_outside`), never taken for a rank failure.

A supervisor is known by what it can do (`Capabilities`, its `can`), never by its
`name`, which is only shown to users: code outside this package asks `can`.

Modules: `systemd.py`, the systemd supervisor (scopes and slices), and
`systemd_api.py`, the one module that talks to systemd (pystemd), `reach.py` for a
manager that does not answer yet, `anchor.py` for the job's anchor service;
`direct.py`, the direct supervisor (the watcher's own cgroups or process groups),
with `cgroups.py` and `pgroups.py` under it and `keeper.py`, what outlives its
watcher (and `sentinel.py`, what outlives both the watcher and the keeper);
`choose.py`, which supervisor a job gets (`--supervisor`), and what it guarantees.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from gpulaunch.errors import GpulaunchError
from gpulaunch.units.definitions import JobUnits

if TYPE_CHECKING:
    from gpulaunch.supervisor.keeper import KeeperLink

# The watcher's way to run a callback when a file descriptor is readable: errors
# raised by the callback reach the watcher's loop, never asyncio's logger.
Watch = Callable[[int, Callable[[], None]], None]


class SupervisorEvents(Protocol):
    """What a supervisor tells the watcher, from inside the watcher's loop."""

    def placed(self, rank: int, error: GpulaunchError | None) -> None:
        """Rank `rank` (its index in the spec) is contained, or could not be (`error`)."""

    def gang_stopped(self) -> None:
        """The ranks' containment is gone: every rank process has ended."""

    def stopped_from_outside(self, what: str) -> None:
        """Someone else is stopping the job's containment: the job is interrupted.

        `what` says by what, for the report ("a stop of gpulaunch-x.slice from outside").
        """

    def manager_gone(self, what: str) -> None:
        """The manager that contained the ranks is gone for good (an ordinary user's manager
        stops at her logout without linger): the job is interrupted, and the watcher ends
        what is left of its ranks itself (their stop jobs went with the manager)."""


@dataclass(frozen=True)
class Capabilities:
    """What a supervisor can do: what the code outside this package asks of it."""

    # Each rank is a unit of the manager's, by name (`Rank.unit`: the report, `status`).
    makes_units: bool
    # The manager's bus is there: the job is published on it (jobapi/publisher.py), and
    # a job that cannot be is warned of; else a record file, and a bus is welcome only.
    publishes_on_bus: bool
    # What the ranks leave when the watcher is SIGKILLed is ended by a keeper, a process
    # that outlives the watcher (keeper.py), forked before the job exists.
    needs_keeper: bool
    # The rank limits (--memory-max, --cpus-per-rank, ...) are unit settings the manager
    # enforces where it has the controllers (resources/controllers.py says which it
    # lacks); False: the supervisor enforces what it can itself and says what it cannot.
    manager_limits: bool


class Supervisor(Protocol):
    """Contains a job's ranks and stops them as one."""

    name: str  # shown to users (the start line, `gpulaunch doctor`); never asked: see `can`
    can: Capabilities  # what it can do
    parent_death_signal: int  # PR_SET_PDEATHSIG of every process the watcher forks; 0: none
    keeper: KeeperLink | None  # where `can.needs_keeper`: the watcher's keeper; else None

    def attach(
        self, loop: asyncio.AbstractEventLoop, watch: Watch, events: SupervisorEvents
    ) -> None:
        """Called once by the watcher before anything else; may watch file descriptors."""

    async def create(self, watcher_pids: Sequence[int]) -> None:
        """The job's containment, with `watcher_pids` inside; undone if it fails halfway."""

    def place(self, rank: int, pids: Sequence[int]) -> None:
        """Contain rank `rank`'s held processes; `SupervisorEvents.placed` follows."""

    def stop_gang(self) -> None:
        """Stop every rank gracefully; `SupervisorEvents.gang_stopped` follows."""

    def kill_gang(self) -> None:
        """SIGKILL every process of every rank now."""

    async def renew_gang(self, units: JobUnits | None = None) -> None:
        """After a gang stop: containment for the ranks of a new attempt (`units`: a new
        round's, its ranks renumbered, for a supervisor that makes units)."""

    def catch_up(self) -> None:
        """Deliver every event that is already on its way (a stop from outside)."""

    def signal_rank(self, rank: int, signum: int) -> None:
        """Send `signum` to every process of rank `rank` (a notice, not a stop)."""
