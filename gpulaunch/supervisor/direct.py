"""The direct supervisor: the watcher contains and stops the ranks itself.

For where systemd cannot or must not take the job (docs/environments.md): a
container without systemd, a CI runner, a Slurm step (whose cgroup the ranks
must stay in: Slurm's limits, GPU binding, accounting and scancel apply to
them there). Two ways, the strongest the place allows:

- `CgroupSupervisor`, where our own cgroup v2 is writable (a container with its
  own cgroup namespace, a service with Delegate=yes)::

      <our cgroup>/gpulaunch-<JOB>/    the job
      ├─ watcher/                      the watcher (and its peer): cgroup v2 lets
      │                                processes live only in leaves
      └─ rank<N>/                      rank N, its log pump and all it starts

  A gang stop is SIGTERM to every process of the rank cgroups, `cgroup.kill`
  after the grace; the gang is gone when every rank cgroup's `cgroup.events`
  says `populated 0` (an inotify watch, no polling). --memory-max and
  --cpus-per-rank/--cpu-bind are memory.max and cpuset.cpus where those
  controllers can be enabled for the job's cgroups.

- `ProcessGroupSupervisor`, where no cgroup is writable: each rank is its own
  process group, the watcher a child subreaper so that a daemonised
  grandchild comes back to it and is stopped with the ranks
  (gpulaunch/supervisor/pgroups.py). No limits can be enforced.

Either way every process the watcher forks gets PR_SET_PDEATHSIG (SIGKILL):
if the watcher is SIGKILLed, the kernel kills the ranks. What they started
(workers, children, setsid daemons) and the job's cgroup are ended by the
keeper (gpulaunch/supervisor/keeper.py), the watcher's parent, which outlives
it: `keeper` is set before the job is created (None only where none could be
forked: a multi-node job on a machine systemd booted, fallen back from systemd
after its peer started).
A job cgroup left by a dead watcher (its `watcher` cgroup empty) does not
block the job id: the next start removes it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Self

from gpulaunch.errors import JobExistsError, SupervisorError
from gpulaunch.linux import (
    become_subreaper,
    inotify_events,
    inotify_init,
    inotify_watch,
)
from gpulaunch.model import JobSpec
from gpulaunch.supervisor import Capabilities, SupervisorEvents, Watch
from gpulaunch.supervisor.cgroups import Cgroup, remove_when_empty
from gpulaunch.supervisor.keeper import KeeperLink, remove_tree
from gpulaunch.supervisor.pgroups import (
    Proc,
    descendants,
    reap_adopted,
    reap_orphans,
    signal_all,
)
from gpulaunch.units.definitions import JobUnits

CLEANUP_TIMEOUT = 5.0  # seconds to wait for killed ranks to leave their cgroups at the end
PDEATHSIG_LINE = "watcher SIGKILLed → ranks killed by the kernel (PDEATHSIG)"
KEEPER_LINE = (
    "watcher SIGKILLed → its keeper (pid {pid}) kills every process of the ranks"
    " and removes what the job made"
)


class _Direct:
    """What both direct supervisors share: the grace timer and the events."""

    name = "direct"
    # No units, no bus of its own to count on, a keeper for what the ranks leave, and its
    # own limits (a cgroup per rank where one is writable: it says what it cannot enforce).
    can = Capabilities(
        makes_units=False, publishes_on_bus=False, needs_keeper=True, manager_limits=False
    )
    parent_death_signal: int = signal.SIGKILL

    def __init__(self, spec: JobSpec, warn: Callable[[str], None]) -> None:
        self.spec = spec
        self.warn = warn
        self._loop: asyncio.AbstractEventLoop | None = None
        self._events: SupervisorEvents | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._stopping = False
        self.keeper: KeeperLink | None = None  # set by start.py before create

    def _death_line(self) -> str:
        """What happens when the watcher is SIGKILLed (for the start line)."""
        if self.keeper is not None:
            return KEEPER_LINE.format(pid=self.keeper.pid)
        return f"{PDEATHSIG_LINE}; daemonised grandchildren stopped only while the watcher lives"

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Nothing of the job left behind (called once the watcher is done)."""

    def _attach(self, loop: asyncio.AbstractEventLoop, events: SupervisorEvents) -> None:
        self._loop = loop
        self._events = events

    def catch_up(self) -> None:
        """Nothing is on its way: the direct supervisor hears of no stop from outside."""

    def _after_grace(self, kill: Callable[[], None]) -> None:
        assert self._loop is not None
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self._loop.call_later(self.spec.grace_sec, kill)

    def _gone(self) -> None:
        if not self._stopping:
            return
        self._stopping = False
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        assert self._events is not None
        self._events.gang_stopped()


class CgroupSupervisor(_Direct):
    """A cgroup v2 subtree of our own: a job cgroup, one cgroup per rank."""

    def __init__(self, spec: JobSpec, own: Cgroup, warn: Callable[[str], None]) -> None:
        super().__init__(spec, warn)
        self.own = own
        self.job = own.child(spec.names.stem)
        self.watcher = self.job.child("watcher")
        self.ranks = [self.job.child(f"rank{r.local_rank}") for r in spec.ranks]
        self._inotify = -1
        self._watches: dict[int, int] = {}  # inotify watch descriptor -> rank index
        self._enabled: list[tuple[Cgroup, str]] = []  # undone at the end, deepest first
        self._limits: set[str] = set()  # controllers the rank cgroups got
        self._created = False

    @property
    def where(self) -> str:
        return str(self.job.path)

    def guarantees(self) -> str:
        return (
            f"{self.name} supervisor (cgroup {self.job.path}): each rank in a cgroup of its own, "
            f"stopped with cgroup.kill; {self._death_line()}"
        )

    def attach(
        self, loop: asyncio.AbstractEventLoop, watch: Watch, events: SupervisorEvents
    ) -> None:
        self._attach(loop, events)
        self._inotify = inotify_init()
        watch(self._inotify, self._on_inotify)

    async def create(self, watcher_pids: Sequence[int]) -> None:
        try:
            self._make_job()
        except FileExistsError:
            raise JobExistsError(
                f"a job named {self.spec.job!r} is already running ({self.job.path})",
                "choose another --job, or stop that one",
            ) from None
        except OSError as exc:
            raise SupervisorError(f"cannot make the job's cgroup {self.job.path}: {exc}") from exc
        self._created = True
        if self.keeper is not None:
            self.keeper.tell(cgroup=str(self.job.path), own=str(self.own.path))
        try:
            self.watcher.make()
            for pid in (*watcher_pids, *self._keepers()):
                self.watcher.add(pid)
            self._enable_limits()
        except OSError as exc:
            self.close()
            raise SupervisorError(f"cannot set up the job's cgroup {self.job.path}: {exc}") from exc
        await self.renew_gang()

    def _make_job(self) -> None:
        """mkdir the job's cgroup; one a dead watcher left (its watcher cgroup empty: neither
        watcher nor keeper in it) is removed first. FileExistsError: the job runs."""
        try:
            self.job.make()
            return
        except FileExistsError:
            if self.watcher.populated():
                raise
        self.warn(f"removing {self.job.path}, left by a job whose watcher is gone")
        if not remove_tree(self.job):
            raise FileExistsError(self.job.path)
        self.job.make()

    def _keepers(self) -> tuple[int, ...]:
        """The keeper, and where limits are asked for its sentinel too: a process left in our
        own cgroup keeps it from handing controllers to the job's (EBUSY). The sentinel then
        sits in the job's `watcher` cgroup and, once keeper and watcher are gone, cannot end
        the job's cgroup itself: the next command's sweep does (jobapi/leftovers.py). Without
        limits it stays beside the keeper and ends it (supervisor/sentinel.py)."""
        if self.keeper is None:
            return ()
        limits = self.spec.memory_max or self.spec.job_memory_max
        if limits or any(r.cpus for r in self.spec.ranks):
            return self.keeper.companions()
        return (self.keeper.pid,)

    def _enable_limits(self) -> None:
        """memory and cpuset for the rank cgroups, when asked for and the kernel allows."""
        wanted = []
        if self.spec.memory_max is not None:
            wanted.append(("memory", "--memory-max"))
        if any(r.cpus for r in self.spec.ranks):
            wanted.append(("cpuset", "--cpus-per-rank/--cpu-bind"))
        if self.spec.job_memory_max is not None:
            wanted.append(("memory", "--job-memory-max"))
        for controller, option in wanted:
            if controller in self._limits:
                continue
            try:
                for cgroup in (self.own, self.job):
                    if controller not in cgroup.enabled():
                        cgroup.enable(controller)
                        self._enabled.insert(0, (cgroup, controller))
                        if self.keeper is not None:
                            self.keeper.tell(enabled=[str(cgroup.path), controller])
                self._limits.add(controller)
            except OSError as exc:
                self.warn(
                    f"{option} is not enforced: the {controller} controller cannot be enabled "
                    f"for {self.job.path} ({exc.strerror or exc}; available: "
                    f"{' '.join(sorted(self.own.controllers())) or 'none'})"
                )
        if "memory" in self._limits and self.spec.job_memory_max is not None:
            self.job.set("memory.max", self.spec.job_memory_max)

    async def renew_gang(self, units: JobUnits | None = None) -> None:
        for index, (cgroup, rank) in enumerate(zip(self.ranks, self.spec.ranks, strict=True)):
            with contextlib.suppress(FileExistsError):
                cgroup.make()
            if "memory" in self._limits and self.spec.memory_max is not None:
                cgroup.set("memory.max", self.spec.memory_max)
            if "cpuset" in self._limits and rank.cpus:
                cgroup.set("cpuset.cpus", rank.cpus)
            wd = inotify_watch(self._inotify, str(cgroup.path / "cgroup.events"))
            self._watches[wd] = index

    def place(self, rank: int, pids: Sequence[int]) -> None:
        assert self._events is not None
        try:
            for pid in pids:
                self.ranks[rank].add(pid)
        except OSError as exc:
            self._events.placed(
                rank,
                SupervisorError(f"cannot move rank {rank} into {self.ranks[rank].path}: {exc}"),
            )
            return
        self._events.placed(rank, None)

    def stop_gang(self) -> None:
        self._stopping = True
        for cgroup in self.ranks:
            cgroup.signal(signal.SIGTERM)
        self._after_grace(self.kill_gang)
        self._on_inotify()

    def kill_gang(self) -> None:
        for cgroup in self.ranks:
            if cgroup.populated():
                cgroup.kill()

    def signal_rank(self, rank: int, signum: int) -> None:
        self.ranks[rank].signal(signum)

    def _on_inotify(self) -> None:
        if self._inotify >= 0:
            inotify_events(self._inotify)
        if self._stopping and not any(c.populated() for c in self.ranks):
            self._gone()

    def close(self) -> None:
        if self._inotify >= 0:
            if self._loop is not None and not self._loop.is_closed():
                self._loop.remove_reader(self._inotify)
            os.close(self._inotify)
            self._inotify = -1
        if not self._created:
            return
        self._created = False
        for cgroup in self.ranks:
            if cgroup.populated():  # an error path: nothing of a rank outlives the job
                cgroup.kill()
        for cgroup, controller in self._enabled:
            cgroup.disable(controller)
        for pid in self.watcher.pids():  # back where we came from, so that ours can go
            with contextlib.suppress(OSError):
                self.own.add(pid)
        remove_when_empty([*self.ranks, self.watcher], CLEANUP_TIMEOUT)
        if not self.job.remove():
            self.warn(f"could not remove the job's cgroup {self.job.path}: it is not empty")
        elif self.keeper is not None:
            self.keeper.tell(released=True)


class ProcessGroupSupervisor(_Direct):
    """No cgroup of our own: process groups, a subreaper, and /proc."""

    def __init__(self, spec: JobSpec, why: str, warn: Callable[[str], None]) -> None:
        super().__init__(spec, warn)
        self.why = why  # why no cgroup
        self._watch: Watch | None = None
        self._rank_pids: dict[int, int] = {}  # rank index -> its main pid (= its pgid)
        self._pumps: set[int] = set()  # the log pumps: they end when the ranks' output does
        self._peer: set[int] = set()  # the watcher's peer (several nodes): not the ranks'
        self._pidfds: dict[int, int] = {}  # pid -> pidfd, for the processes being stopped
        self._adopting = False  # from create() on: an orphan can be adopted, our peer is known

    @property
    def where(self) -> str:
        return "process groups"

    def guarantees(self) -> str:
        return (
            f"{self.name} supervisor (process groups; no cgroup: {self.why}): "
            f"{self._death_line()}; no limits enforced"
        )

    def attach(
        self, loop: asyncio.AbstractEventLoop, watch: Watch, events: SupervisorEvents
    ) -> None:
        self._attach(loop, events)
        self._watch = watch
        become_subreaper()
        # What we adopt and what then exits is our zombie until we reap it: on SIGCHLD.
        signal.signal(signal.SIGCHLD, self._on_child)
        if self.spec.memory_max or self.spec.job_memory_max or any(r.cpus for r in self.spec.ranks):
            self.warn(
                "--memory-max/--job-memory-max/--cpus-per-rank/--cpu-bind are not enforced: "
                f"no cgroup can be written here ({self.why})"
            )

    async def create(self, watcher_pids: Sequence[int]) -> None:
        self._peer.update(p for p in watcher_pids if p != os.getpid())
        self._adopting = True

    async def renew_gang(self, units: JobUnits | None = None) -> None:
        self._rank_pids.clear()

    def place(self, rank: int, pids: Sequence[int]) -> None:
        # procs.fork_held made each its own process group already (setpgid before the gate).
        assert self._events is not None
        self._rank_pids[rank] = pids[0]
        self._pumps.update(pids[1:])
        self._events.placed(rank, None)

    @property
    def _ours(self) -> set[int]:
        """The watcher's own children, which it reaps itself."""
        return {*self._rank_pids.values(), *self._pumps, *self._peer}

    def _targets(self, with_pumps: bool = False) -> list[Proc]:
        """The live processes of the ranks (and adopted orphans); zombie orphans reaped."""
        skip = self._peer if with_pumps else self._peer | self._pumps
        found = descendants([os.getpid()], set(self._rank_pids.values()), skip)
        reap_adopted([p for p in found if p.zombie], self._ours)
        return [p for p in found if not p.zombie]

    def stop_gang(self) -> None:
        self._stopping = True
        signal_all(self._targets(), signal.SIGTERM)
        self._after_grace(self.kill_gang)
        self._track()

    def kill_gang(self) -> None:
        signal_all(self._targets(with_pumps=True), signal.SIGKILL)
        self._track()

    def signal_rank(self, rank: int, signum: int) -> None:
        main = self._rank_pids.get(rank)
        if main is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(main, signum)

    def _track(self) -> None:
        """Watch every process still to go; gone when a fresh look finds none."""
        if not self._stopping:
            return
        live = self._targets()
        if not live:
            self._close_pidfds()
            self._gone()
            return
        for proc in live:
            if proc.pid in self._pidfds:
                continue
            try:
                fd = os.pidfd_open(proc.pid)
            except ProcessLookupError:
                continue
            self._pidfds[proc.pid] = fd
            assert self._watch is not None
            self._watch(fd, self._exited(proc.pid))
        if not self._pidfds:  # every one of them went away meanwhile: look again
            assert self._loop is not None
            self._loop.call_soon(self._track)

    def _exited(self, pid: int) -> Callable[[], None]:
        def on_exit() -> None:
            fd = self._pidfds.pop(pid, -1)
            if fd >= 0:
                assert self._loop is not None
                self._loop.remove_reader(fd)
                os.close(fd)
            if pid not in self._ours:  # an adopted orphan: ours to reap
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, os.WNOHANG)
            self._track()

        return on_exit

    def _on_child(self, signum: int, frame: object) -> None:
        """SIGCHLD's handler: the reaping is the loop's (never in a handler)."""
        loop = self._loop
        if self._adopting and loop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # closed meanwhile
                loop.call_soon_threadsafe(lambda: reap_orphans(self._ours))

    def _close_pidfds(self) -> None:
        for fd in self._pidfds.values():
            if self._loop is not None and not self._loop.is_closed():
                self._loop.remove_reader(fd)
            os.close(fd)
        self._pidfds.clear()

    def close(self) -> None:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        self._close_pidfds()
        live = self._targets(with_pumps=True)
        if live:  # an error path: nothing of a rank outlives the job
            signal_all(live, signal.SIGKILL)
        if self._timer is not None:
            self._timer.cancel()
