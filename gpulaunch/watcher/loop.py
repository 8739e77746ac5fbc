"""The watcher: one single-threaded event loop that runs a job (docs/architecture.md).

It forks every rank held at a gate, has its supervisor contain each, opens the gates,
then sleeps until a rank's pidfd, the supervisor, a signal, an observer, an error file or
a deadline wakes it: no polling (the grace is systemd.kill(5)'s; watcher/eventloop.py).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack
from pathlib import Path

from gpulaunch.base.interrupts import NOTICES, RESUMED, pending
from gpulaunch.base.procs import HeldChild, kill_and_reap, reap, spawn_held
from gpulaunch.base.protocol import NodeFailure
from gpulaunch.errors import GpulaunchError, StoppedWhileStartingError
from gpulaunch.logs.journal import journal_limit
from gpulaunch.logs.output import Output, OutputOptions, Stream
from gpulaunch.logs.pump import JournalTarget, journal_status
from gpulaunch.logs.width import rank_columns
from gpulaunch.model import JobProgress, JobReport, JobSpec, Phase, RankExit, RankState, job_outcome
from gpulaunch.multinode.othernodes import OtherNodes
from gpulaunch.multinode.peerlink import Interrupted, PeerLink
from gpulaunch.multinode.rounds import Next
from gpulaunch.parts import Controls, Part, Parts
from gpulaunch.plan.environment import attempt_environment
from gpulaunch.progress.channel import ProgressChannel
from gpulaunch.recovery.settings import RecoveryOptions
from gpulaunch.recovery.tracker import Recovery
from gpulaunch.supervisor import Supervisor
from gpulaunch.units.definitions import JobUnits
from gpulaunch.warm.process import WarmProcess
from gpulaunch.watcher.drops import LostOutput
from gpulaunch.watcher.errorfile import ErrorFiles, rank_error, runtime_base
from gpulaunch.watcher.errorwatch import ErrorFileWatch, tearing_down
from gpulaunch.watcher.eventloop import EventLoop
from gpulaunch.watcher.final import UsageReader
from gpulaunch.watcher.forkrank import fork_rank
from gpulaunch.watcher.hangwatch import HangWatch
from gpulaunch.watcher.notices import pass_on, preempt, preempt_while_stopping
from gpulaunch.watcher.origin import blame_teardown
from gpulaunch.watcher.outcome import job_report
from gpulaunch.watcher.ranks import Rank, let_pumps_go
from gpulaunch.watcher.rounds import next_round
from gpulaunch.watcher.settle import Settle
from gpulaunch.watcher.terminal import RankStdin, interrupt_ranks
from gpulaunch.watcher.unmanaged import end_ranks


class Watcher(EventLoop):
    """Runs one job to its end and returns its `JobReport`; `parts`: the job's optional
    parts, called in the list's order at the points gpulaunch/parts.py names."""

    def __init__(
        self,
        spec: JobSpec,
        supervisor: Supervisor,
        wakeup_fd: int,
        parts: Sequence[Part] = (),
        *,  # the loop's own, by name:
        clock: Callable[[], float] = time.monotonic,
        output: Output | None = None,
        journal: bool = False,
        runtime_dir: Path | None = None,
        peer: PeerLink | None = None,
        hang: HangWatch | None = None,
        recovery: RecoveryOptions | None = None,
        why_signalled: Callable[[int], str | None] = lambda signum: None,
        contained_in: str | None = None,
        warm: WarmProcess | None = None,
    ) -> None:
        super().__init__()
        self.spec = spec
        self.supervisor = supervisor
        self.wakeup_fd = wakeup_fd
        os.set_blocking(wakeup_fd, False)  # read between forks too, not only when readable
        self.clock = clock
        self.phase = Phase.STARTING
        self.ranks = [Rank(spec=r, units=supervisor.can.makes_units) for r in spec.ranks]
        self.pump_pids: dict[int, list[int]] = {}  # rank -> its pumps' pids, every attempt
        self.interrupt: tuple[float, int] | None = None
        # what interrupted it if not a signal: `gpulaunch stop`, a stop from outside
        self.interrupted_by: str | None = None
        self._signalled = False  # a first SIGINT/SIGTERM/SIGHUP came: the next one kills
        self.why_signalled = why_signalled  # a signal: its launcher's death? (launcher.py)
        self.contained_in = contained_in  # no unit: where the ranks are (JobProgress)
        self.stop_issued = False
        self.gang_stopping = False  # asked the supervisor to stop the gang, not yet gone
        self.start_error: GpulaunchError | None = None
        self.parts = Parts(parts)
        self.output = output or Output(OutputOptions(), spec.world_size)
        self.stdin = RankStdin(spec.stdin_rank, spec.world_size, self.output)  # --stdin-rank
        self.journal = journal  # whether the pumps write to journald
        self._lost = LostOutput(spec, self.output, journal)  # the report's lost lines
        self._settle = Settle(spec.grace_sec)  # see _finished
        self._all_forked = False  # every rank of this attempt forked and its scope asked for
        self._runtime_dir = runtime_dir or runtime_base(spec.manager)
        self._errors: ErrorFiles | None = None
        self._written: ErrorFileWatch | None = None  # inotify: a rank's @record wrote its file
        self._failure_pending: str | None = None  # a rank failed; see _failed
        self.nodes: OtherNodes | None = None  # several nodes: what the others said
        self.usage = UsageReader(spec)  # what each rank used, read as it ends
        self.hang = hang  # --hang-timeout, --dump-stacks (watcher/hangwatch.py)
        self.recovery = Recovery(spec.max_restarts, recovery or RecoveryOptions())
        # restarts so far, any node (a requeued Slurm job's: after its earlier runs')
        self.attempt = spec.layout.attempt if spec.layout else self.recovery.requeue.first_attempt
        self.warm = warm  # --preload: ranks forked from a warm process (gpulaunch/warm/)
        self.steps = ProgressChannel(
            spec, lambda: self.ranks, self.output.message, journal, base=self._runtime_dir
        )
        if peer is not None:
            assert spec.layout is not None
            self.nodes = OtherNodes(peer, spec.layout, clock, self._elsewhere)

    # -- the loop ---------------------------------------------------------

    def run(self) -> JobReport:
        with ExitStack() as stack:
            stack.callback(self._aio.close)
            # On any error path: no child of ours outlives run().
            stack.callback(
                lambda: kill_and_reap([c for r in self.ranks for c in (r.child, r.pump)])
            )
            stack.callback(let_pumps_go, self.ranks)
            stack.callback(self.usage.close)
            self._watch(self.wakeup_fd, self._on_signal)
            self.supervisor.attach(self._aio, self._watch, self)
            self.output.attach(self._aio, self._poke, self._watch)
            stack.callback(self.output.close)
            self.stdin.attach(self._aio, stack, self.supervisor)
            stack.callback(self.parts.close)
            self.parts.attach(
                self.progress(), Controls(self.request_stop, self.signal_ranks), self._aio
            )
            if self.nodes is not None:
                self.nodes.attach(self._watch, self._aio.remove_reader)
            if self.warm is not None:  # first: it imports while the units are made
                self.warm.start()
                stack.callback(self.warm.close)
            self._create_job_units(stack)
            self._errors = stack.enter_context(
                ErrorFiles(self._runtime_dir, self.spec.names.component)
            )
            self._written = stack.enter_context(ErrorFileWatch())
            self._watch(self._written.fileno(), self._on_error_file)
            self.steps.attach(stack, self._aio, self._watch, lambda: self._notify(None))
            self.parts.created()
            while True:
                if not self._stopping_asked():
                    self._start_ranks()
                if self._stopping_asked() or self.start_error is not None:
                    self._begin_stop()
                self._loop(self._finished)
                if not self._restart():
                    break
            self._set_phase(Phase.DONE)
            report = self.parts.complete(
                self._lost.complete(self.report(), self.ranks, self.pump_pids)
            )
            # also after a failed start: it is recorded too
            self._aio.run_until_complete(self.parts.finished(self.progress(), report))
            if self.start_error is not None:
                raise self.start_error
            return report

    def _restart(self) -> bool:
        """After a failure, start the gang again if recovery/ says so (--max-restarts, ...)."""
        if self.nodes is not None:  # every node's gang, together (watcher/rounds.py)
            return self._next_round(self.nodes)
        report, stopping = self.report(), self._stopping_asked()  # (its cause rank's error read)
        self.recovery.stepped = any(rank.steps is not None for rank in self.ranks)
        if not self.recovery.restart(report, self._exits(), stopping, self.output.message):
            return False
        self.attempt += 1
        self.new_attempt()
        return True

    def _next_round(self, nodes: OtherNodes) -> bool:
        if nodes.next not in (None, Next.END):  # (a part times it: progress/phases.py)
            self.parts.round_opened()
        try:
            new = next_round(nodes, self.spec, self.wakeup_fd, self.output.message)
        except Interrupted as exc:
            self.interrupt = (self.clock(), exc.exit_code - 128)
            return False
        except GpulaunchError as exc:  # the rendezvous failed (NodeLinkError): said as at start
            self.start_error = exc
            return False
        if new is not None:
            self.parts.round_closed()
            self.spec, self.attempt = new.spec, new.attempt
            self.new_attempt(new.units)
        return new is not None

    def _elsewhere(self, failure: NodeFailure) -> None:
        """Another node failed first: stop ours."""
        self.output.message(f"gpulaunch: {failure.describe()}; stopping this node's ranks")
        if self.phase is not Phase.STARTING:
            self._begin_stop()

    def new_attempt(self, units: JobUnits | None = None) -> None:
        """The gang of the next attempt, in new containment (the last one stopped);
        `units`: a new round's, where its ranks were renumbered (watcher/rounds.py)."""
        if self.hang is not None:
            self.hang.hung_at = None  # that hang caused this restart, not the job's end
        self.ranks = [Rank(spec=r, units=self.supervisor.can.makes_units) for r in self.spec.ranks]
        self.stop_issued = False
        self._failure_pending = None
        self._settle = Settle(self.spec.grace_sec)
        self._all_forked = False
        self._set_phase(Phase.STARTING)
        self._run(self.supervisor.renew_gang(units))

    def _stopping_asked(self) -> bool:
        """Interrupted, or another node failed: no (more) ranks to start."""
        return self.interrupt is not None or (
            self.nodes is not None and self.nodes.elsewhere_at is not None
        )

    def request_stop(self) -> None:
        """Stop the job gracefully, as a first SIGTERM would (for observers: `gpulaunch stop`)."""
        self._signalled = True  # as before: a signal after it kills at once
        self._interrupted(signal.SIGTERM, "gpulaunch stop")
        self._poke()

    def _interrupted(self, signum: int, by: str | None, stop: bool = True) -> None:
        """The first interrupt is the job's (`by`: what it was, if not a signal to us)."""
        if self.interrupt is None:
            self.interrupt = (self.clock(), signum)
            self.interrupted_by = by
            if self.nodes is not None:
                self.nodes.offer_interrupt(signum)
        if stop and self.phase is not Phase.STARTING:
            self._begin_stop()

    def _set_phase(self, phase: Phase) -> None:
        if phase is not self.phase:
            self.phase = phase
            self._notify(None)

    def _advance(self, rank: Rank, state: RankState) -> None:
        rank.advance(state)
        self._notify(rank)

    def _notify(self, rank: Rank | None) -> None:
        if self.parts:  # (no snapshot for nobody)
            self.parts.changed(self.progress(), rank.progress() if rank is not None else None)

    def progress(self) -> JobProgress:
        """The job as it is now, for observers."""
        return JobProgress(
            spec=self.spec,
            phase=self.phase,
            ranks=tuple(r.progress() for r in self.ranks),
            attempt=self.attempt,
            watcher_pid=os.getpid(),
            node_failure=self.nodes.failure if self.nodes else None,
            contained_in=self.contained_in,
            carried=self.recovery.carried(self.attempt, ended=False),
        )

    def _finished(self) -> bool:
        if any(r.state.alive for r in self.ranks):
            return False
        pumps_done = all(r.pump is None or r.pump.pidfd < 0 for r in self.ranks)
        output_done = pumps_done and self.output.open_pipes == 0
        if not self.stop_issued:  # every rank ended by itself (watcher/settle.py)
            wait = self._settle.wait(self.clock(), self.output.open_pipes > 0, pumps_done)
            if wait is not None:
                if wait[1]:  # a new deadline: be woken then
                    self._aio.call_later(wait[0], self._poke)
                return False
            self._begin_stop()
        done = not self.gang_stopping and output_done
        if not done or self.nodes is None:
            return done
        ending = self.interrupt is not None or self.start_error is not None
        after = self.nodes.after_round(ending, self.recovery.max_restarts, self.recovery.policy)
        # Through the exit barrier (a store our peer serves stays until every node is done),
        # unless every node goes on to another round.
        return after is not None and (after is not Next.END or self.nodes.finish())

    # -- starting ---------------------------------------------------------

    def _create_job_units(self, stack: ExitStack) -> None:
        """The job's containment, with us (and our peer) inside."""
        # From here on our death stops the job (systemd: BindsTo=, PropagatesStopTo=).
        # The peer shares our containment: it outlives us just long enough to tell
        # the other nodes that we died.
        pids = (os.getpid(),) if self.nodes is None else (os.getpid(), self.nodes.peer.pid)
        if self.warm is not None and self.warm.pid is not None:  # it lives beside us
            pids = (*pids, self.warm.pid)
        self._run(self.supervisor.create((*pids, *self.stdin.readers)))

    def _start_ranks(self) -> None:
        """Fork every rank at its gate and ask the supervisor to contain it; the gates open
        when it said every rank is contained (`placed`: systemd moves after its reply)."""
        try:
            self.parts.before_attempt(self.attempt)  # may it start? (the GPUs' health gate)
        except GpulaunchError as exc:  # as a failed start: the gang stops, the job ends
            self.start_error = exc
            return
        if self.warm is not None:
            self._await_warm()
        for index, rank in enumerate(self.ranks):
            self._on_signal()  # a big job: hear a SIGTERM between two forks, not after the last
            if self.interrupt is not None or self.stop_issued:
                return
            self._fork_rank(rank)
            assert rank.child is not None and rank.pump is not None
            try:
                self.supervisor.place(index, (rank.child.pid, rank.pump.pid))
            except StoppedWhileStartingError:  # systemctl stop of the job: an interrupt
                self.interrupt = self.interrupt or (self.clock(), signal.SIGTERM)
                return
            except GpulaunchError as exc:
                self.start_error = exc
                return
        self._all_forked = True
        self._open_gates()
        if not self.stop_issued:
            self._set_phase(Phase.RUNNING)

    def _await_warm(self) -> None:
        """The warm process's imports done, or the job interrupted meanwhile (a Ctrl-C while
        torch imports stops the job now: no rank is forked after it)."""
        assert self.warm is not None
        task = self._aio.create_task(self.warm.ready())
        task.add_done_callback(lambda _: self._poke())
        try:
            self._loop(lambda: task.done() or self._stopping_asked())
        finally:
            if not task.done():
                task.cancel()

    def _fork_rank(self, rank: Rank) -> None:
        """The rank and its log pump, both held at their gates, wired by pipes."""
        journal = JournalTarget(f"rank{rank.spec.rank}", rank.spec.unit, journal_limit())
        target = journal if self.journal else None
        assert self._errors is not None
        error_file = self._errors.path(self.attempt, rank.spec.rank)
        if self._written is not None:
            self._written.add(error_file.parent, self.attempt, rank.spec.rank)
        env = attempt_environment(rank.spec.env, self.attempt, str(error_file))
        if not rank.units:  # the direct supervisor makes no unit to name
            env.pop("GPULAUNCH_UNIT", None)
        env.update(self.recovery.rank_environment(self._errors.root))
        env.update(self.steps.environment())
        setup = self.parts.rank_setup(rank.spec, self.attempt)  # a GPU lease's fds
        env.update(setup.env)
        out = self.output
        env.update(rank_columns(env, (out.stdout.fd, out.stderr.fd, 0), self.spec.world_size))

        def born(rank: Rank) -> None:
            assert rank.child is not None
            rank.born_at = self.clock()
            self._advance(rank, RankState.HELD)
            self._watch(rank.child.pidfd, lambda: self._on_exit(rank))

        death = self.supervisor.parent_death_signal
        live_out_r, live_err_r = fork_rank(
            rank, env, target, death, born, self.stdin.fd_for, setup.fds, self._spawner(rank)
        )
        assert rank.pump is not None
        self.pump_pids.setdefault(rank.spec.rank, []).append(rank.pump.pid)
        self._watch(rank.pump.pidfd, self._pump_handler(rank))
        self.output.add_pipe(live_out_r, rank.spec.rank, Stream.STDOUT)
        self.output.add_pipe(live_err_r, rank.spec.rank, Stream.STDERR)

    def _spawner(
        self, rank: Rank
    ) -> Callable[[Sequence[str], Mapping[str, str], Mapping[int, int], int], HeldChild]:
        """A new interpreter (spawn_held), or a fork of the warm process where it can be."""
        warm = self.warm
        if warm is None:
            return spawn_held

        def spawn(
            argv: Sequence[str], env: Mapping[str, str], fds: Mapping[int, int], death: int
        ) -> HeldChild:
            child = warm.spawn(rank.spec.rank, argv, env, fds, death)
            return child if child is not None else spawn_held(argv, env, fds, death)

        return spawn

    # -- events -----------------------------------------------------------

    def _on_signal(self) -> None:
        for signum in pending(self.wakeup_fd):
            if self.interrupt is None and self.recovery.preempted(signum, self.clock()):
                self._preempt(signum)
            elif signum in NOTICES:  # not a stop: passed on to the ranks
                self.signal_ranks(signum)
            elif signum == RESUMED:  # `fg`: read the terminal again (watcher/terminal.py)
                self.stdin.resume()
            # A stop from outside that reaches our own scope sends us a SIGTERM
            # too: that one is still the first signal, not a second interrupt.
            elif not self._signalled:
                self._signalled = True
                self._interrupted(signum, self.why_signalled(signum), stop=not self._ctrl_c(signum))
            else:
                self._kill_now()

    def _ctrl_c(self, signum: int) -> bool:
        """The first SIGINT while the ranks run: passed on to them as SIGINT, as a terminal's
        ^C under torchrun (watcher/terminal.py), True; any other interrupt, or one while they
        start or stop, is the gang stop's (SIGTERM), False."""
        if signum != signal.SIGINT or self.phase is not Phase.RUNNING:
            return False
        interrupt_ranks(self.ranks, self._aio, self.spec.grace_sec, self._kill_now)
        return True

    def _preempt(self, signum: int) -> None:
        """The machine goes away: --preempt-grace for the ranks (watcher/notices.py)."""
        self._signalled = True  # a further SIGINT/SIGTERM kills at once
        self._interrupted(signum, None, stop=self.phase is not Phase.RUNNING)
        if self.phase is Phase.RUNNING:  # else nothing runs yet, or it stops already
            self.output.message(self.recovery.preempt.line(signum))
            preempt(self.ranks, self.signal_ranks, self.recovery.preempt, self._aio, self._kill_now)
        elif self.phase is Phase.STOPPING:  # e.g. for a restart: no restart now (notices.py)
            line = preempt_while_stopping(signum, self.signal_ranks, self.recovery.preempt)
            self.output.message(line)

    def signal_ranks(self, signum: int, rank: int | None = None) -> int:
        """A notice to the running ranks (watcher/notices.py); how many got it."""
        return pass_on(self.ranks, self.supervisor, self.spec.signal_whole_rank, signum, rank)

    # -- what the supervisor says (gpulaunch.supervisor.SupervisorEvents) --

    def placed(self, index: int, error: GpulaunchError | None) -> None:
        rank = self.ranks[index]
        if rank.state is not RankState.HELD or self.stop_issued:
            return  # it died at the gate, or we are stopping and killed it there
        if error is not None:
            self.start_error = error
            self._begin_stop()
            return
        rank.in_scope = True
        self._open_gates()

    def gang_stopped(self) -> None:
        self.gang_stopping = False

    def stopped_from_outside(self, what: str) -> None:
        for rank in self.ranks:  # systemd is stopping them: none of them failed
            if rank.state.alive:
                rank.stop_requested = True
        self._interrupted(signal.SIGTERM, what)

    def manager_gone(self, what: str) -> None:
        """Nobody stops the ranks for us now: we do (watcher/unmanaged.py)."""
        self.output.message(f"gpulaunch: job {self.spec.job}: {what}; stopping its ranks")
        self.stopped_from_outside(what)
        self._begin_stop()  # (while starting too: no rank may run without a manager)
        end_ranks(self.ranks, signal.SIGTERM)
        self._aio.call_later(self.spec.grace_sec, end_ranks, self.ranks, signal.SIGKILL)

    def _open_gates(self) -> None:
        """Let every rank run at once, when all of them are in their scopes (all at once: one
        by one, the first ranks' start-up would compete with the others' scope creation)."""
        if self.stop_issued or not self._all_forked or not all(r.in_scope for r in self.ranks):
            return
        for rank in self.ranks:
            if rank.state is RankState.HELD:
                rank.release()
        now = self.clock()
        for rank in self.ranks:
            if rank.state is RankState.HELD:
                rank.born_at = now
                self._advance(rank, RankState.RUNNING)
        if self.hang is not None:
            self.hang.say = self.output.message
            self.hang.start(self._aio, lambda: self.ranks, self._stop_after_stacks)

    def _pump_handler(self, rank: Rank) -> Callable[[], None]:
        def on_pump_exit() -> None:
            assert rank.pump is not None
            rank.journal_missed, rank.journal_crowded = journal_status(reap(rank.pump.pidfd).code)
            self._aio.remove_reader(rank.pump.pidfd)
            rank.pump.close()

        return on_pump_exit

    def _on_exit(self, rank: Rank) -> None:
        assert rank.child is not None
        status, used, oom = self.usage.reap(rank.child, rank.cgroup)
        rank.let_pump_go()  # its scope's cgroup is read: it may go now
        if (status.code != 0 or status.signal is not None) and not rank.stop_requested:
            # Did it fail, or was it stopped from outside? Hear the supervisor first.
            self.supervisor.catch_up()
        now = self.clock()
        self._aio.remove_reader(rank.child.pidfd)
        rank.child.close()
        rank.exit = rank.ended(status, now, used, oom)
        self._advance(rank, RankState.STOPPED if rank.stop_requested else RankState.EXITED)
        if rank.exit.failed and not rank.stop_requested:
            why = f"rank {rank.spec.rank} {rank.exit.describe()}"
            if self.nodes is not None:
                error, source = self._rank_error(rank.spec.rank)
                self.nodes.offer(why, rank.exit.status, rank.spec.rank, error, source)
            else:  # one node: a rank that only lost a peer may not be the cause (origin.py)
                blame_teardown(rank, self.ranks, self.output.stderr_tail, self.output.raised_at)
            self._failed(why)
        elif self._failure_pending is not None:
            self._failed(self._failure_pending)

    def _failed(self, why: str, late_for: int | None = None) -> None:
        """A rank failed: the gang stop, once no rank that wrote its error file runs (--grace)."""
        if self.stop_issued or late_for not in (None, self.attempt):
            return
        if late_for is None and self.nodes is None and tearing_down(self.ranks):
            if self._failure_pending is None:  # the true cause tearing down: let it fail itself
                self._aio.call_later(self.spec.grace_sec, self._failed, why, self.attempt)
            self._failure_pending = why
            return
        self._stop_after_stacks(why, failure=True)
        self._poke()

    def _on_error_file(self) -> None:
        """A rank's @record wrote its error file: it stops nothing (watcher/errorwatch.py)."""
        assert self._written is not None and self._errors is not None
        self._written.note(self._errors, self.ranks, self.attempt, self.clock())

    def _stop_after_stacks(self, why: str, failure: bool = False) -> None:
        """--hang-timeout, --dump-stacks: the live ranks' stacks first, then the gang stop."""
        if self.hang is None or (failure and not self.hang.dump_stacks) or self.stop_issued:
            return self._begin_stop()
        self.hang.cancel()
        task = self._aio.create_task(self.hang.take(self.ranks, why))
        task.add_done_callback(lambda _: self._request_stop_now())

    def _request_stop_now(self) -> None:
        self._begin_stop()
        self._poke()

    # -- stopping ---------------------------------------------------------

    def _begin_stop(self) -> None:
        """Gang stop: the supervisor sends SIGTERM to every rank, SIGKILL after the grace."""
        if self.stop_issued:
            return
        self.stop_issued = True
        self._set_phase(Phase.STOPPING)
        for rank in self.ranks:
            if rank.state.alive:
                rank.stop_requested = True
            rank.kill_if_held()
        self.gang_stopping = True
        self.supervisor.stop_gang()

    def _kill_now(self) -> None:
        """A second interrupt: SIGKILL everything of the ranks without waiting for the grace."""
        self._begin_stop()
        self.supervisor.kill_gang()

    # -- the outcome ------------------------------------------------------

    def _exits(self) -> dict[int, RankExit]:
        return {r.spec.rank: r.exit for r in self.ranks if r.exit is not None}

    def _rank_error(self, rank: int) -> tuple[str | None, str | None]:
        return rank_error(self._errors, self.attempt, rank, self.output.stderr_tail)

    def report(self) -> JobReport:
        return self.recovery.complete(self._report(), self.attempt)  # (a Slurm run's carry)

    def _report(self) -> JobReport:
        return job_report(
            self.spec,
            self.ranks,
            self.recovery.outcome(  # a crash loop's or a preemption's, else the rules'
                job_outcome(
                    self._exits(),
                    self.interrupt,
                    self.nodes.elsewhere if self.nodes is not None else None,
                    self.hang.hung_at if self.hang else None,
                ),
                self.interrupt,
            ),
            interrupt=self.interrupt,
            interrupted_by=self.interrupted_by,
            start_error=self.start_error,
            restarts=self.attempt,
            node_failure=self.nodes.failure if self.nodes else None,
            rounds=tuple(self.nodes.ended) if self.nodes else (),
            rank_error=self._rank_error,
            hang=self.hang.summary if self.hang else None,
            stacks=self.hang.stacks if self.hang else None,
            recovery=self.recovery.line,
        )
