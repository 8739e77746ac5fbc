"""The systemd supervisor: every rank a transient scope, the job a slice.

```
gpulaunch-<JOB>.slice
├─ gpulaunch-<JOB>-anchor.service  waits for the watcher's pid (PropagatesStopTo= the job slice)
├─ gpulaunch-<JOB>-watcher.scope   the watcher (PropagatesStopTo= the job slice)
└─ gpulaunch-<JOB>-ranks.slice     stopped as one when a rank fails
   └─ gpulaunch-<JOB>-rankN.scope  BindsTo= + After= the watcher scope
```

The strongest containment gpulaunch has: if the watcher dies in any way, its
scope ends, and systemd stops every rank (BindsTo=) and removes the job slice
(PropagatesStopTo=) with no code of ours alive; the anchor does the same for
a watcher killed before its scope held it (supervisor/anchor.py). See
docs/architecture.md and systemd.scope(5), systemd.kill(5).

A lost connection to systemd (daemon-reexec) is reconnected once it is seen;
the state of whatever we were waiting for is then read from the units, as
their `JobRemoved` may have gone to the old connection. A manager that does not
answer again within moments (supervisor/reach.py) is gone for good (an ordinary user's
manager stops at her logout without linger, `loginctl terminate-user`): the
watcher hears `manager_gone`, and nothing is asked of systemd any more.
"""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, TypeVar

from gpulaunch.errors import (
    GpulaunchError,
    JobExistsError,
    NoSystemdError,
    StoppedWhileStartingError,
    SystemdError,
)
from gpulaunch.supervisor import Capabilities, SupervisorEvents, Watch
from gpulaunch.supervisor.reach import retry
from gpulaunch.supervisor.systemd_api import ConnectionLost, JobDone, JobEvent, SystemdAPI
from gpulaunch.units.codec import Property
from gpulaunch.units.definitions import JobUnits, UnitDefinition

if TYPE_CHECKING:
    from gpulaunch.supervisor.keeper import KeeperLink

T = TypeVar("T")
# The path of a start job that ended while the connection was lost (`_lost_while_creating`).
_SETTLED = "/gpulaunch/settled"


class SystemdSupervisor:
    """Scopes and slices of the system or a user manager (gpulaunch.supervisor.Supervisor)."""

    name = "systemd"
    can = Capabilities(
        makes_units=True, publishes_on_bus=True, needs_keeper=False, manager_limits=True
    )
    parent_death_signal = 0  # the rank scopes are BindsTo= the watcher's: systemd stops them
    keeper: KeeperLink | None = None  # BindsTo= and the anchor outlive a killed watcher

    def __init__(
        self, systemd: SystemdAPI, units: JobUnits, warn: Callable[[str], None] | None = None
    ) -> None:
        self.sd = systemd
        self.units = units
        # through the terminal's owner (logs/output.py) when start.py gives one
        self._warn = warn or (lambda text: print(f"gpulaunch: warning: {text}", file=sys.stderr))
        self._loop: asyncio.AbstractEventLoop | None = None
        self._events: SupervisorEvents | None = None
        # systemd jobs we wait for, by object path.
        self._awaited: dict[str, tuple[str, asyncio.Future[str]]] = {}
        self._rank_jobs: dict[str, int] = {}
        self._stop_job: str | None = None
        self._watch: Watch | None = None
        self._fd = -1
        self._reconnected = False
        self._gang_stop_asked = False  # then jobs on the ranks' units are ours
        self._outside = False  # a stop from outside was reported
        self._creating = False  # create() runs: the job slice's start job (no path of ours)
        self._gone = False  # the manager stopped for good: nothing is asked of it any more

    def attach(
        self, loop: asyncio.AbstractEventLoop, watch: Watch, events: SupervisorEvents
    ) -> None:
        self._loop = loop
        self._events = events
        self._watch = watch
        self._fd = self.sd.fileno()
        watch(self._fd, self._on_bus)

    # -- creating ---------------------------------------------------------

    async def create(self, watcher_pids: Sequence[int]) -> None:
        """The job slice, the watcher's own scope (with the watcher inside), the ranks slice."""
        units = self.units
        # units/anchor.service, for the watcher's pid (supervisor/anchor.py says why).
        anchor = units.anchor(watcher_pids[0])
        name, props = anchor.name, anchor.properties
        self._creating = True
        try:
            # The job slice and the anchor in one call: both exist, or neither does.
            created = self._start_unit(
                name, props, aux=[(units.job_slice.name, units.job_slice.properties)]
            )
        except JobExistsError as exc:
            raise JobExistsError(
                f"a job named {units.job!r} is already running ({units.job_slice.name})",
                f"choose another --job, or stop that one: systemctl stop {units.job_slice.name}",
            ) from exc
        try:
            # From here on the watcher's death stops the job slice (the anchor's
            # PropagatesStopTo=) and, through BindsTo=, every rank: no code of ours
            # needs to run for that.
            await self._done(created, name)
            await self._done(self._start(units.watcher, watcher_pids), units.watcher.name)
            self._creating = False
            await self.renew_gang()
        except StoppedWhileStartingError:
            # `systemctl stop` of the job as its units were made (a start job canceled, a
            # "destructive" transaction): an interrupt, reported and recorded as one. The
            # manager's end (`_gone`) told the watcher itself.
            if self._gone:
                raise
            self._stopped_from_outside(units.job_slice.name)  # (our stop's jobs: ours)
            self._call(lambda: self.sd.stop_unit(units.job_slice.name))
            return
        except BaseException:
            self._outside = True  # the stop jobs that follow are ours
            self._call(lambda: self.sd.stop_unit(units.job_slice.name))
            raise
        self._anchor_held(name)

    def _anchor_held(self, anchor: str) -> None:
        """A stop of the job slice while create() ran took it for ours (its JobNew came
        while the slice's own start job was expected) and may have ended before the
        watcher scope was made, which started the slice again: the stop was lost (the
        job ran to its end). Every stop of the slice stops the anchor in it, which ends
        only with us otherwise: it is the witness."""
        state = self._call(lambda: self.sd.unit_state(anchor))
        if state is not None and (state.job_pending or state.active not in ("active", "reloading")):
            self._stopped_from_outside(self.units.job_slice.name)

    async def renew_gang(self, units: JobUnits | None = None) -> None:
        # A gang stop removes the ranks slice; a new attempt needs it again.
        self.units = units or self.units
        self._gang_stop_asked = False
        await self._done(self._start(self.units.ranks_slice), self.units.ranks_slice.name)

    def place(self, rank: int, pids: Sequence[int]) -> None:
        unit = self.units.ranks[rank]
        path = self._create(
            lambda: self.sd.start_transient(unit.name, unit.properties, pids), unit.name
        )
        self._rank_jobs[path] = rank
        self._on_bus()  # signals that arrived during the call wait in sd-bus's queue

    def _start(self, unit: UnitDefinition, pids: Sequence[int] = ()) -> asyncio.Future[str]:
        return self._start_unit(unit.name, unit.properties, pids)

    def _start_unit(
        self,
        name: str,
        properties: Sequence[Property],
        pids: Sequence[int] = (),
        aux: Sequence[tuple[str, Sequence[Property]]] = (),
    ) -> asyncio.Future[str]:
        assert self._loop is not None
        path = self._create(
            lambda: self.sd.start_transient(name, properties, pids, aux),
            name,
        )
        done = self._loop.create_future()
        self._awaited[path] = (name, done)
        self._on_bus()
        return done

    def _create(self, call: Callable[[], str], name: str) -> str:
        """A StartTransientUnit call: its start job's path (to wait for)."""
        if self._gone:
            raise StoppedWhileStartingError(f"the job's systemd manager went away ({name})")
        try:
            # No owner of the manager's name on the bus (a user manager's daemon-reexec): the
            # call never reached it, so it is asked again while it comes back (reach.py).
            return retry(call, (NoSystemdError,))
        except ConnectionLost as exc:  # it may or may not have created `name`
            return self._lost_while_creating(call, name, exc)

    def _lost_while_creating(self, call: Callable[[], str], name: str, exc: ConnectionLost) -> str:
        """The connection went during the call (a daemon-reexec, a restart of the bus): on
        a new one, whether systemd created `name` decides. Not there: it is asked again;
        its start job still queued: that job is waited for; active: done (its JobRemoved
        went to the old connection). Only a manager gone for good fails the start."""
        state = self._call(lambda: self.sd.unit_state(name)) if self._reconnect() else None
        if state is None:
            raise StoppedWhileStartingError(
                f"the job's systemd manager went away while creating {name} ({exc})"
            ) from exc
        if state.job:
            return state.job
        if state.active in ("active", "reloading"):
            path = f"{_SETTLED}/{name}"
            assert self._loop is not None  # handled once the caller waits for `path`
            self._loop.call_soon(self._handle, [JobDone(path=path, unit=name, result="done")])
            return path
        if state.active == "inactive":  # never created (or collected at once): again
            return self._create(call, name)
        raise SystemdError(f"systemd could not start {name}: it is {state.active}")

    async def _done(self, job: asyncio.Future[str], name: str) -> None:
        result = await job
        if result == "canceled":  # only a stop job replaces a start job we did not cancel
            raise StoppedWhileStartingError(
                f"the job was stopped from outside while it started ({name}: its start job "
                "was canceled)"
            )
        if result != "done":
            raise SystemdError(f"systemd could not start {name}: its start job ended '{result}'")

    # -- stopping ---------------------------------------------------------

    def stop_gang(self) -> None:
        """systemd sends SIGTERM to each rank's whole cgroup, SIGKILL after TimeoutStopSec=."""
        self._gang_stop_asked = True
        if self._gone:  # the manager, stopping, stopped every unit; the watcher ends the rest
            self._gang_stopped()
            return
        self._stop_job = self._call(lambda: self.sd.stop_unit(self.units.ranks_slice.name))
        self._on_bus()
        if self._stop_job is None:  # the slice is not loaded: nothing left to stop
            self._gang_stopped()

    def kill_gang(self) -> None:
        def kill_all() -> None:
            for unit in self.units.ranks:
                self.sd.kill_unit(unit.name, signal.SIGKILL)

        self._call(kill_all)
        self._on_bus()

    def signal_rank(self, rank: int, signum: int) -> None:
        self._call(lambda: self.sd.kill_unit(self.units.ranks[rank].name, signum))
        self._on_bus()

    def catch_up(self) -> None:
        # systemd queues a stop job (JobNew) before it sends the SIGTERM: after a
        # round trip, the news of a `systemctl stop` that killed a rank is here.
        if self._gone:
            return
        try:
            self.sd.ping()
        except ConnectionLost:
            if not self._reconnect():
                return
        self._on_bus()

    def _gang_stopped(self) -> None:
        assert self._events is not None
        self._events.gang_stopped()

    # -- the bus ----------------------------------------------------------

    def _call(self, call: Callable[[], T | None]) -> T | None:
        """An idempotent call (stop, kill): made again on a new connection if it was lost;
        None when the manager is gone (it stops every unit itself as it goes)."""
        if self._gone:
            return None
        try:
            return call()
        except ConnectionLost:
            if not self._reconnect():
                return None
            return call()

    def _reconnect(self) -> bool:
        """A new connection, watched instead of the old; then what we missed.

        A manager being re-executed, or a bus being restarted, answers again within
        moments (supervisor/reach.py). False: it is gone for good
        (`manager_gone` was told); True: the job goes on.
        """
        assert self._loop is not None and self._watch is not None
        if self._gone:
            return False
        self._loop.remove_reader(self._fd)  # before the old fd is closed (its number is reused)
        self._fd = -1
        try:
            retry(self._connect_again, (ConnectionLost, GpulaunchError))
            return True
        except (ConnectionLost, GpulaunchError) as exc:
            self._manager_lost(exc)
            return False

    def _manager_lost(self, exc: BaseException) -> None:
        """The manager does not answer any more: what we waited for from it never comes."""
        self._gone = True
        reason = str(exc.message if isinstance(exc, GpulaunchError) else exc)
        gone = StoppedWhileStartingError(f"the job's systemd manager went away ({reason})")
        for _, future in self._awaited.values():
            if not future.done():
                future.set_exception(gone)
        self._awaited.clear()
        self._rank_jobs.clear()
        assert self._events is not None
        self._events.manager_gone(f"the end of its systemd manager ({reason})")
        if self._gang_stop_asked and self._stop_job is not None:
            self._stop_job = None  # its JobRemoved went with the manager
            self._gang_stopped()

    def _connect_again(self) -> None:
        assert self._loop is not None and self._watch is not None
        if self._fd >= 0:  # watched, then lost again: unwatched before it closes
            self._loop.remove_reader(self._fd)
            self._fd = -1
        self.sd.reconnect()
        self._fd = self.sd.fileno()
        self._watch(self._fd, self._on_bus)
        if not self._reconnected:
            self._reconnected = True
            self._warn(
                f"job {self.units.job}: the connection to systemd was "
                "lost (daemon-reexec, or a restart of the bus); reconnected, the job goes on"
            )
        self._settle_missed()

    def _settle_missed(self) -> None:
        """Jobs that ended while we were away: their result from their unit's state."""
        missed: list[JobDone] = []
        waiting = [(path, unit) for path, (unit, _) in self._awaited.items()]
        waiting += [(path, self.units.ranks[r].name) for path, r in self._rank_jobs.items()]
        if self._stop_job is not None:
            waiting.append((self._stop_job, self.units.ranks_slice.name))
        for path, unit in waiting:
            state = self.sd.unit_state(unit)
            if state.job_pending:
                continue  # its JobRemoved will come on the new connection
            stopping = path == self._stop_job
            ok = state.active in (("inactive", "failed") if stopping else ("active", "reloading"))
            missed.append(JobDone(path=path, unit=unit, result="done" if ok else "failed"))
        self._handle(missed)

    def _on_bus(self) -> None:
        if self._gone:
            return
        try:
            jobs = self.sd.events()
        except ConnectionLost:
            if not self._reconnect():
                return
            jobs = self.sd.events()
        self._handle(jobs)

    def _handle(self, jobs: Sequence[JobEvent]) -> None:
        assert self._events is not None
        for job in jobs:
            if not isinstance(job, JobDone):
                self._queued(job.path, job.unit)
            elif job.path == self._stop_job:
                self._stop_job = None
                self._gang_stopped()
            elif job.path in self._awaited:
                _, future = self._awaited.pop(job.path)
                if not future.done():
                    future.set_result(job.result)
            elif job.path in self._rank_jobs:
                rank = self._rank_jobs.pop(job.path)
                if job.result == "canceled" and not self._gang_stop_asked:
                    # A stop job replaced the rank's start job: a stop from outside (143),
                    # not a failure of systemd's (71). Our own gang stop is told apart.
                    self._stopped_from_outside(self.units.ranks[rank].name)
                    continue
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
        # While create() runs, the job slice's start job comes from the anchor's call (an
        # auxiliary unit has no job path of its own in the reply): that one is ours too.
        job = set() if self._creating else {units.job_slice.name, units.watcher.name}
        if (
            ours
            or self._outside
            or not (unit in job or (unit in gang and not self._gang_stop_asked))
        ):
            return
        self._stopped_from_outside(unit)

    def _stopped_from_outside(self, unit: str) -> None:
        if self._outside:
            return
        self._outside = True
        assert self._events is not None
        self._events.stopped_from_outside(f"a stop of {unit} from outside")
