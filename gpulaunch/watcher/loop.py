"""The watcher: one single-threaded event loop that runs a job.

It forks every rank held at a gate, has systemd put each in its scope, opens
the gates, then sleeps in the event loop until something happens: a rank's
pidfd becomes readable, systemd reports a finished job on the bus, a signal
arrives through the wakeup fd, or an observer (the D-Bus publisher) asks for
something. There is no timer and no poll interval: the grace period belongs to
systemd (`TimeoutStopSec=` of the rank scopes, systemd.kill(5)).

The loop is asyncio's (an epoll loop on one thread), driven from synchronous
code: `_loop(until)` runs it until `until()` holds, re-checking after every
event. asyncio because the libraries that publish objects on D-Bus need it.
"""

from __future__ import annotations

import asyncio
import enum
import errno
import os
import signal
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from gpulaunch.errors import GpulaunchError, JobExistsError, SystemdError
from gpulaunch.logs.output import Output, OutputOptions, Stream
from gpulaunch.logs.pump import IGNORED_SIGNALS, JournalTarget, run_pump
from gpulaunch.model import (
    Cause,
    JobReport,
    JobSpec,
    RankExit,
    RankResult,
    RankSpec,
    RankState,
    check_transition,
    job_outcome,
)
from gpulaunch.multinode.othernodes import OtherNodes
from gpulaunch.multinode.peerlink import PeerLink
from gpulaunch.multinode.protocol import NodeFailure
from gpulaunch.plan.environment import attempt_environment
from gpulaunch.plan.spec import JobUnits
from gpulaunch.supervisor.systemd_api import SystemdAPI
from gpulaunch.units.templates import UnitDefinition
from gpulaunch.watcher.errorfile import ErrorFiles, runtime_base
from gpulaunch.watcher.interrupts import pending
from gpulaunch.watcher.procs import HeldChild, fork_held, kill_held, reap, spawn_held


class Phase(enum.StrEnum):
    """The job's life: starting -> running -> stopping -> done."""

    STARTING = "starting"
    RUNNING = "running"
    STOPPING = "stopping"
    DONE = "done"


@dataclass
class Rank:
    """The live record of one rank; only the watcher's loop changes it."""

    spec: RankSpec
    state: RankState = RankState.PENDING
    child: HeldChild | None = None
    pump: HeldChild | None = None  # copies the rank's output to journald and to us
    in_scope: bool = False  # systemd finished moving it (and its pump) into its scope
    born_at: float = 0.0
    stop_requested: bool = False
    exit: RankExit | None = None

    def advance(self, new: RankState) -> None:
        check_transition(self.state, new)
        self.state = new


class Observer(Protocol):
    """Follows a job as it runs: the D-Bus publisher, the terminal, ..."""

    def attach(self, watcher: Watcher, loop: asyncio.AbstractEventLoop) -> None:
        """Called once, before anything starts; may add readers to the loop."""

    def changed(self, rank: Rank | None) -> None:
        """A rank's state changed, or (None) the job's phase."""

    async def finished(self, report: JobReport) -> None:
        """The job ended; awaited (with a bound) before the watcher returns."""


FINISH_TIMEOUT = 2.0  # how long observers may take to publish the end of a job


class Watcher:
    """Runs one job to its end and returns its `JobReport`."""

    def __init__(
        self,
        spec: JobSpec,
        units: JobUnits,
        systemd: SystemdAPI,
        wakeup_fd: int,
        clock: Callable[[], float] = time.monotonic,
        on_created: Callable[[], None] = lambda: None,
        observers: Sequence[Observer] = (),
        output: Output | None = None,
        journal: bool = False,
        runtime_dir: Path | None = None,
        peer: PeerLink | None = None,
    ) -> None:
        self.spec = spec
        self.units = units
        self.sd = systemd
        self.wakeup_fd = wakeup_fd
        self.clock = clock
        self.on_created = on_created  # called once the job's units exist
        self.phase = Phase.STARTING
        self.ranks = [Rank(spec=r) for r in spec.ranks]
        self.interrupt: tuple[float, int] | None = None
        self.stop_job: str | None = None
        self.stop_issued = False
        self.start_error: GpulaunchError | None = None
        # systemd jobs we wait for, by object path: their result once finished.
        self._awaited: dict[str, str | None] = {}
        self._rank_jobs: dict[str, Rank] = {}
        self.observers = tuple(observers)
        self.output = output or Output(OutputOptions(), spec.world_size)
        self.journal = journal  # whether the pumps write to journald
        self._aio = asyncio.new_event_loop()
        self._changed: asyncio.Future[None] | None = None
        self.attempt = 0  # restarts of the whole gang so far (--max-restarts)
        self._settle_deadline: float | None = None  # see _finished
        self._all_forked = False  # every rank of this attempt forked and its scope asked for
        self._runtime_dir = runtime_dir or runtime_base(spec.manager)
        self._errors: ErrorFiles | None = None
        self.nodes: OtherNodes | None = None  # several nodes: what the others said
        if peer is not None:
            assert spec.layout is not None
            self.nodes = OtherNodes(peer, spec.layout, clock, self._on_elsewhere)

    # -- the loop ---------------------------------------------------------

    def run(self) -> JobReport:
        with ExitStack() as stack:
            stack.callback(self._aio.close)
            stack.callback(self._kill_and_reap_all)
            self._watch(self.wakeup_fd, self._on_signal)
            self._watch(self.sd.fileno(), self._on_bus)
            self.output.attach(self._aio, self._poke)
            stack.callback(self.output.close)
            for observer in self.observers:
                observer.attach(self, self._aio)
            if self.nodes is not None:
                self.nodes.attach(self._watch, self._aio.remove_reader)
            self._create_job_units(stack)
            self._errors = stack.enter_context(
                ErrorFiles(self._runtime_dir, self.spec.names.component)
            )
            self.on_created()
            while True:
                if not self._stopping_asked():
                    self._start_ranks()
                if self._stopping_asked() or self.start_error is not None:
                    self._begin_stop()
                self._loop(self._finished)
                if not self._restart():
                    break
            self._set_phase(Phase.DONE)
            report = self.report()
            for observer in self.observers:  # also after a failed start: it is recorded too
                self._aio.run_until_complete(
                    asyncio.wait_for(observer.finished(report), FINISH_TIMEOUT)
                )
            if self.start_error is not None:
                raise self.start_error
            return report

    def _restart(self) -> bool:
        """After a rank failure, start the whole gang again while --max-restarts allows."""
        outcome = job_outcome(self._exits(), self.interrupt)
        if (
            outcome.cause is not Cause.RANK_FAILED
            or self.start_error is not None
            or self.attempt >= self.spec.max_restarts
        ):
            return False
        self.attempt += 1
        cause = self.ranks[outcome.cause_rank or 0]
        assert cause.exit is not None
        self.output.message(
            f"gpulaunch: rank {cause.spec.rank} {cause.exit.describe()}; restarting all "
            f"ranks (restart {self.attempt} of {self.spec.max_restarts})"
        )
        self.ranks = [Rank(spec=r) for r in self.spec.ranks]
        self.stop_issued = False
        self._settle_deadline = None
        self._all_forked = False
        self._set_phase(Phase.STARTING)
        # The gang stop removed the ranks slice; the new ranks need it again.
        self._wait_job(self._start_unit(self.units.ranks_slice), self.units.ranks_slice.name)
        return True

    def _stopping_asked(self) -> bool:
        """Interrupted, or another node failed: no (more) ranks to start."""
        return self.interrupt is not None or (
            self.nodes is not None and self.nodes.elsewhere_at is not None
        )

    def request_stop(self) -> None:
        """Stop the job gracefully, as a first SIGTERM would (for observers)."""
        if self.interrupt is None:
            self.interrupt = (self.clock(), signal.SIGTERM)
            if self.nodes is not None:
                self.nodes.offer_interrupt(signal.SIGTERM)
        if self.phase is not Phase.STARTING:
            self._begin_stop()
        self._poke()

    def _watch(self, fd: int, handler: Callable[[], None]) -> None:
        def dispatch() -> None:
            try:
                handler()
            except BaseException as exc:  # asyncio would only log it: raise it from _loop
                if self._changed is not None and not self._changed.done():
                    self._changed.set_exception(exc)
                    return
                raise
            self._poke()

        self._aio.add_reader(fd, dispatch)

    def _poke(self) -> None:
        if self._changed is not None and not self._changed.done():
            self._changed.set_result(None)

    def _loop(self, until: Callable[[], bool]) -> None:
        while not until():
            self._changed = self._aio.create_future()
            self._aio.run_until_complete(self._changed)

    def _set_phase(self, phase: Phase) -> None:
        if phase is not self.phase:
            self.phase = phase
            self._notify(None)

    def _advance(self, rank: Rank, state: RankState) -> None:
        rank.advance(state)
        self._notify(rank)

    def _notify(self, rank: Rank | None) -> None:
        for observer in self.observers:
            observer.changed(rank)

    def _finished(self) -> bool:
        if any(r.state.alive for r in self.ranks):
            return False
        pumps_done = all(r.pump is None or r.pump.pidfd < 0 for r in self.ranks)
        output_done = pumps_done and self.output.open_pipes == 0
        if not self.stop_issued:
            # Every rank ended by itself. Let the log pumps hand their last lines
            # to journald first (stopping the slice would end them after the
            # grace), unless something the ranks left behind keeps their output
            # open: then after the grace. Either way stop the ranks slice, so
            # that nothing a rank left behind (a daemonised helper) outlives it.
            if not output_done and self._settle_deadline is None:
                self._settle_deadline = self.clock() + self.spec.grace_sec
                self._aio.call_later(self.spec.grace_sec, self._poke)
            if not output_done and self.clock() < (self._settle_deadline or 0):
                return False
            self._begin_stop()
        done = self.stop_job is None and output_done
        if not done or self.nodes is None:
            return done
        # Through the exit barrier: a store our peer serves stays until every node is done.
        return self.nodes.finish()

    # -- starting ---------------------------------------------------------

    def _start_unit(
        self, unit: UnitDefinition, pids: tuple[int, ...] = (), rank: Rank | None = None
    ) -> str:
        path = self.sd.start_transient(unit.name, unit.properties, pids)
        if rank is None:
            self._awaited[path] = None
        else:
            self._rank_jobs[path] = rank
        self._on_bus()  # signals that arrived during the call wait in sd-bus's queue
        return path

    def _wait_job(self, path: str, unit: str) -> None:
        self._loop(lambda: self._awaited[path] is not None)
        result = self._awaited.pop(path)
        if result != "done":
            raise SystemdError(f"systemd could not start {unit}: its start job ended '{result}'")

    def _create_job_units(self, stack: ExitStack) -> None:
        """The job slice, the watcher's own scope (with us inside), the ranks slice."""
        units = self.units
        try:
            path = self._start_unit(units.job_slice)
        except JobExistsError as exc:
            raise JobExistsError(
                f"a job named {self.spec.job!r} is already running ({units.job_slice.name})",
                f"choose another --job, or stop that one: systemctl stop {units.job_slice.name}",
            ) from exc
        undo = stack.enter_context(ExitStack())
        undo.callback(self.sd.stop_unit, units.job_slice.name)
        self._wait_job(path, units.job_slice.name)
        # From here on our death stops the job slice (PropagatesStopTo=) and,
        # through BindsTo=, every rank: no code of ours needs to run for that.
        # The peer shares our scope: it outlives us just long enough to tell the
        # other nodes that we died, and then the scope is empty.
        pids = (os.getpid(),) if self.nodes is None else (os.getpid(), self.nodes.peer.pid)
        self._wait_job(self._start_unit(units.watcher, pids), units.watcher.name)
        undo.pop_all()
        self._wait_job(self._start_unit(units.ranks_slice), units.ranks_slice.name)

    def _start_ranks(self) -> None:
        """Fork every rank at its gate and ask systemd for its scope.

        The gates open one by one as each scope's start job finishes (in
        `_on_bus`): the reply to StartTransientUnit comes before the move.
        """
        by_unit = {u.name: u for u in self.units.ranks}
        for rank in self.ranks:
            if self.interrupt is not None or self.stop_issued:
                return
            self._fork_rank(rank)
            assert rank.child is not None and rank.pump is not None
            try:
                self._start_unit(by_unit[rank.spec.unit], (rank.child.pid, rank.pump.pid), rank)
            except GpulaunchError as exc:
                self.start_error = exc
                return
        self._all_forked = True
        self._open_gates()
        if not self.stop_issued:
            self._set_phase(Phase.RUNNING)

    def _fork_rank(self, rank: Rank) -> None:
        """The rank and its log pump, both held at their gates, wired by pipes."""
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        live_out_r, live_out_w = os.pipe()
        live_err_r, live_err_w = os.pipe()
        target = (
            JournalTarget(identifier=f"rank{rank.spec.rank}", unit=rank.spec.unit)
            if self.journal
            else None
        )
        assert self._errors is not None
        error_file = self._errors.path(self.attempt, rank.spec.rank)
        env = attempt_environment(rank.spec.env, self.attempt, str(error_file))
        try:
            rank.child = spawn_held(rank.spec.argv, env, {1: out_w, 2: err_w})
            rank.born_at = self.clock()
            self._advance(rank, RankState.HELD)
            self._watch(rank.child.pidfd, self._exit_handler(rank))
            rank.pump = fork_held(
                lambda: run_pump(
                    {"stdout": 3, "stderr": 4}, {"stdout": 5, "stderr": 6}, target, rank.spec.rank
                ),
                {3: out_r, 4: err_r, 5: live_out_w, 6: live_err_w},
                ignore=IGNORED_SIGNALS,
            )
            self._watch(rank.pump.pidfd, self._pump_handler(rank))
        finally:
            for fd in (out_r, out_w, err_r, err_w, live_out_w, live_err_w):
                os.close(fd)
        self.output.add_pipe(live_out_r, rank.spec.rank, Stream.STDOUT)
        self.output.add_pipe(live_err_r, rank.spec.rank, Stream.STDERR)

    # -- events -----------------------------------------------------------

    def _on_signal(self) -> None:
        for signum in pending(self.wakeup_fd):
            if self.interrupt is None:
                self.interrupt = (self.clock(), signum)
                if self.nodes is not None:
                    self.nodes.offer_interrupt(signum)
                if self.phase is not Phase.STARTING:
                    self._begin_stop()
            else:
                self._kill_now()

    def _on_bus(self) -> None:
        for job in self.sd.events():
            if job.path == self.stop_job:
                self.stop_job = None
            elif job.path in self._awaited:
                self._awaited[job.path] = job.result
            elif job.path in self._rank_jobs:
                self._on_rank_started(self._rank_jobs.pop(job.path), job.result)

    def _on_rank_started(self, rank: Rank, result: str) -> None:
        if rank.state is not RankState.HELD or self.stop_issued:
            return  # it died at the gate, or we are stopping and killed it there
        if result != "done":
            self.start_error = SystemdError(
                f"systemd could not start {rank.spec.unit}: its start job ended '{result}'"
            )
            self._begin_stop()
            return
        rank.in_scope = True
        self._open_gates()

    def _open_gates(self) -> None:
        """Let every rank run at once, when all of them are in their scopes.

        One by one would let the first ranks' start-up compete for the CPUs with
        the watcher still creating the others' scopes; and a gang waits for its
        slowest member at its first collective anyway.
        """
        if self.stop_issued or not self._all_forked or not all(r.in_scope for r in self.ranks):
            return
        for rank in self.ranks:
            if rank.state is RankState.HELD:
                assert rank.child is not None and rank.pump is not None
                rank.pump.release()
                rank.child.release()
        now = self.clock()
        for rank in self.ranks:
            if rank.state is RankState.HELD:
                rank.born_at = now
                self._advance(rank, RankState.RUNNING)

    def _exit_handler(self, rank: Rank) -> Callable[[], None]:
        return lambda: self._on_exit(rank)

    def _pump_handler(self, rank: Rank) -> Callable[[], None]:
        def on_pump_exit() -> None:
            assert rank.pump is not None
            reap(rank.pump.pidfd)
            self._aio.remove_reader(rank.pump.pidfd)
            rank.pump.close()

        return on_pump_exit

    def _on_exit(self, rank: Rank) -> None:
        assert rank.child is not None
        status = reap(rank.child.pidfd)
        now = self.clock()
        self._aio.remove_reader(rank.child.pidfd)
        rank.child.close()
        rank.exit = RankExit(
            code=status.code,
            signal=status.signal,
            stopped_by_watcher=rank.stop_requested,
            observed_at=now,
            runtime=now - rank.born_at,
            core_dumped=status.core_dumped,
        )
        self._advance(rank, RankState.STOPPED if rank.stop_requested else RankState.EXITED)
        if rank.exit.failed and not rank.stop_requested:
            if self.nodes is not None:
                error, source = self._rank_error(rank.spec.rank)
                what = f"rank {rank.spec.rank} {rank.exit.describe()}"
                self.nodes.offer(what, rank.exit.status, rank.spec.rank, error, source)
            self._begin_stop()

    # -- the other nodes (multi-node jobs) ------------------------------

    @property
    def node_failure(self) -> NodeFailure | None:
        """A multi-node job's first failure, on any node (None: none, or one node)."""
        return self.nodes.failure if self.nodes is not None else None

    def _on_elsewhere(self, failure: NodeFailure) -> None:
        """Another node failed first: stop ours."""
        self.output.message(f"gpulaunch: {failure.describe()}; stopping this node's ranks")
        if self.phase is not Phase.STARTING:
            self._begin_stop()

    # -- stopping ---------------------------------------------------------

    def _begin_stop(self) -> None:
        """Gang stop: systemd sends SIGTERM to each rank's whole cgroup, SIGKILL after the grace."""
        if self.stop_issued:
            return
        self.stop_issued = True
        self._set_phase(Phase.STOPPING)
        for rank in self.ranks:
            if rank.state.alive:
                rank.stop_requested = True
            if rank.state is RankState.HELD and rank.child is not None:
                # Never ran user code: nothing to be graceful about.
                for child in (rank.child, rank.pump):
                    if child is not None:
                        child.abandon()
                        kill_held(child)
        self.stop_job = self.sd.stop_unit(self.units.ranks_slice.name)
        self._on_bus()

    def _kill_now(self) -> None:
        """A second interrupt: SIGKILL everything of the ranks without waiting for the grace."""
        self._begin_stop()
        for rank in self.ranks:
            self.sd.kill_unit(rank.spec.unit, signal.SIGKILL)
        self._on_bus()

    def _kill_and_reap_all(self) -> None:
        """On any error path: no child of ours outlives this function."""
        for child in [c for r in self.ranks for c in (r.child, r.pump)]:
            if child is None or child.pidfd < 0:
                continue
            child.abandon()
            try:
                signal.pidfd_send_signal(child.pidfd, signal.SIGKILL)
            except ProcessLookupError:
                pass
            try:
                reap(child.pidfd)
            except ChildProcessError:
                pass
            except OSError as exc:  # pragma: no cover - defensive
                if exc.errno != errno.ECHILD:
                    raise
            child.close()

    # -- the outcome ------------------------------------------------------

    def _exits(self) -> dict[int, RankExit]:
        return {r.spec.rank: r.exit for r in self.ranks if r.exit is not None}

    def _rank_error(self, rank: int) -> tuple[str | None, str | None]:
        """The cause rank's own error: its @record traceback, else its last stderr lines."""
        from_file = self._errors.read(self.attempt, rank) if self._errors else None
        if from_file:
            return from_file, "its error file (@record)"
        tail = self.output.stderr_tail(rank)
        return (tail, "the last lines of its stderr") if tail else (None, None)

    def report(self) -> JobReport:
        elsewhere = self.nodes.elsewhere if self.nodes is not None else None
        outcome = job_outcome(self._exits(), self.interrupt, elsewhere)
        error = self.start_error
        results = []
        for r in self.ranks:
            text, source = (
                self._rank_error(r.spec.rank) if r.spec.rank == outcome.cause_rank else (None, None)
            )
            results.append(
                RankResult(
                    rank=r.spec.rank,
                    unit=r.spec.unit,
                    pid=r.child.pid if r.child is not None else None,
                    exit=r.exit,
                    error=text,
                    error_source=source,
                )
            )
        return JobReport(
            job=self.spec.job,
            status=outcome.status if error is None else error.exit_code,
            cause=outcome.cause if error is None else Cause.START_FAILED,
            cause_rank=outcome.cause_rank,
            interrupt_signal=self.interrupt[1] if self.interrupt else None,
            ranks=tuple(results),
            error=None if error is None else error.message,
            restarts=self.attempt,
            layout=self.spec.layout,
            node_failure=self.node_failure,
        )
