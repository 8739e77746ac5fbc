"""The systemd supervisor: every rank a transient scope, the job a slice.

```
gpulaunch-<JOB>.slice
├─ gpulaunch-<JOB>-watcher.scope   the watcher (PropagatesStopTo= the job slice)
└─ gpulaunch-<JOB>-ranks.slice     stopped as one when a rank fails
   └─ gpulaunch-<JOB>-rankN.scope  BindsTo= + After= the watcher scope
```

The strongest containment gpulaunch has: if the watcher dies in any way, its
scope ends, and systemd stops every rank (BindsTo=) and removes the job slice
(PropagatesStopTo=) with no code of ours alive. See docs/architecture.md and
systemd.scope(5), systemd.kill(5).
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Sequence

from gpulaunch.errors import JobExistsError, SystemdError
from gpulaunch.supervisor import SupervisorEvents, Watch
from gpulaunch.supervisor.systemd_api import JobDone, SystemdAPI
from gpulaunch.units.definitions import JobUnits, UnitDefinition


class SystemdSupervisor:
    """Scopes and slices of the system or a user manager (gpulaunch.supervisor.Supervisor)."""

    name = "systemd"

    def __init__(self, systemd: SystemdAPI, units: JobUnits) -> None:
        self.sd = systemd
        self.units = units
        self._loop: asyncio.AbstractEventLoop | None = None
        self._events: SupervisorEvents | None = None
        # systemd jobs we wait for, by object path.
        self._awaited: dict[str, asyncio.Future[str]] = {}
        self._rank_jobs: dict[str, int] = {}
        self._stop_job: str | None = None
        self._gang_stop_asked = False  # then jobs on the ranks' units are ours
        self._outside = False  # a stop from outside was reported

    def attach(
        self, loop: asyncio.AbstractEventLoop, watch: Watch, events: SupervisorEvents
    ) -> None:
        self._loop = loop
        self._events = events
        watch(self.sd.fileno(), self._on_bus)

    # -- creating ---------------------------------------------------------

    async def create(self, watcher_pids: Sequence[int]) -> None:
        """The job slice, the watcher's own scope (with the watcher inside), the ranks slice."""
        units = self.units
        try:
            created = self._start(units.job_slice)
        except JobExistsError as exc:
            raise JobExistsError(
                f"a job named {units.job!r} is already running ({units.job_slice.name})",
                f"choose another --job, or stop that one: systemctl stop {units.job_slice.name}",
            ) from exc
        try:
            await self._done(created, units.job_slice)
            # From here on the watcher's death stops the job slice (PropagatesStopTo=)
            # and, through BindsTo=, every rank: no code of ours needs to run for that.
            await self._done(self._start(units.watcher, watcher_pids), units.watcher)
        except BaseException:
            self._outside = True  # the stop jobs that follow are ours
            self.sd.stop_unit(units.job_slice.name)
            raise
        await self.renew_gang()

    async def renew_gang(self) -> None:
        # A gang stop removes the ranks slice; a new attempt needs it again.
        self._gang_stop_asked = False
        await self._done(self._start(self.units.ranks_slice), self.units.ranks_slice)

    def place(self, rank: int, pids: Sequence[int]) -> None:
        path = self.sd.start_transient(
            self.units.ranks[rank].name, self.units.ranks[rank].properties, pids
        )
        self._rank_jobs[path] = rank
        self._on_bus()  # signals that arrived during the call wait in sd-bus's queue

    def _start(self, unit: UnitDefinition, pids: Sequence[int] = ()) -> asyncio.Future[str]:
        assert self._loop is not None
        path = self.sd.start_transient(unit.name, unit.properties, pids)
        done = self._awaited[path] = self._loop.create_future()
        self._on_bus()
        return done

    async def _done(self, job: asyncio.Future[str], unit: UnitDefinition) -> None:
        result = await job
        if result != "done":
            raise SystemdError(
                f"systemd could not start {unit.name}: its start job ended '{result}'"
            )

    # -- stopping ---------------------------------------------------------

    def stop_gang(self) -> None:
        """systemd sends SIGTERM to each rank's whole cgroup, SIGKILL after TimeoutStopSec=."""
        self._gang_stop_asked = True
        self._stop_job = self.sd.stop_unit(self.units.ranks_slice.name)
        self._on_bus()
        if self._stop_job is None:  # the slice is not loaded: nothing left to stop
            self._gang_stopped()

    def stop_ranks(self, ranks: Sequence[int]) -> None:
        """StopUnit on each rank's scope (SIGTERM, SIGKILL after TimeoutStopSec=)."""
        for rank in ranks:
            self.sd.stop_unit(self.units.ranks[rank].name)
        self._on_bus()

    def kill_gang(self) -> None:
        for unit in self.units.ranks:
            self.sd.kill_unit(unit.name, signal.SIGKILL)
        self._on_bus()

    def catch_up(self) -> None:
        # systemd queues a stop job (JobNew) before it sends the SIGTERM: after a
        # round trip, the news of a `systemctl stop` that killed a rank is here.
        self.sd.ping()
        self._on_bus()

    def _gang_stopped(self) -> None:
        assert self._events is not None
        self._events.gang_stopped()

    # -- the bus ----------------------------------------------------------

    def _on_bus(self) -> None:
        assert self._events is not None
        for job in self.sd.events():
            if not isinstance(job, JobDone):
                self._queued(job.path, job.unit)
            elif job.path == self._stop_job:
                self._stop_job = None
                self._gang_stopped()
            elif job.path in self._awaited:
                future = self._awaited.pop(job.path)
                if not future.done():
                    future.set_result(job.result)
            elif job.path in self._rank_jobs:
                rank = self._rank_jobs.pop(job.path)
                error = None
                if job.result != "done":
                    unit = self.units.ranks[rank].name
                    error = SystemdError(
                        f"systemd could not start {unit}: its start job ended '{job.result}'"
                    )
                self._events.placed(rank, error)

    def _queued(self, path: str, unit: str) -> None:
        """A job on one of our units that we did not ask for is a stop from outside.

        Our own jobs are known by path before their JobNew is dispatched (the
        reply comes first); the jobs systemd adds for the ranks' units to our
        gang stop are ours too.
        """
        units = self.units
        ours = path in self._awaited or path in self._rank_jobs or path == self._stop_job
        gang = {units.ranks_slice.name, *(r.name for r in units.ranks)}
        job = {units.job_slice.name, units.watcher.name}
        if (
            ours
            or self._outside
            or not (unit in job or (unit in gang and not self._gang_stop_asked))
        ):
            return
        self._outside = True
        assert self._events is not None
        self._events.stopped_from_outside(f"a stop of {unit} from outside")
