"""`gpulaunch start` and `gpulaunch render`: from start options to a finished job.

The one owner of a job's start: plan it (gpulaunch/plan/), render its units
(gpulaunch/units/), join the other nodes (gpulaunch/multinode/), choose its
supervisor (gpulaunch/supervisor/), build the job's parts (gpulaunch/parts.py: its
records and bus API, metrics, GPUs, start line), run the watcher (gpulaunch/watcher/)
with them, then print the report. cli.py parses the
command line; errors raised here become messages there.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack, suppress
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from gpulaunch.base.detach import Detached
from gpulaunch.base.interrupts import ignore_interrupts, install_wakeup
from gpulaunch.base.protocol import Layout
from gpulaunch.debug.options import HangOptions
from gpulaunch.errors import NoSystemdError
from gpulaunch.frontend.tether import tether_observers
from gpulaunch.leases.health import open_gate
from gpulaunch.leases.part import GpuPart
from gpulaunch.leases.request import stand_in
from gpulaunch.logs.output import Output, OutputOptions
from gpulaunch.metrics.observer import MetricsOptions, metrics_observers
from gpulaunch.model import JobReport, JobSpec, Manager, SupervisorKind
from gpulaunch.parts import Part
from gpulaunch.plan.environment import omp_default_applies
from gpulaunch.plan.spec import (
    JobDraft,
    StartOptions,
    default_environment,
    draft_job,
    make_spec,
    number_ranks,
    working_directory,
)
from gpulaunch.recovery.settings import RecoveryOptions
from gpulaunch.report import count, format_report
from gpulaunch.resources.controllers import unenforced
from gpulaunch.schedulers.observers import scheduler_observers
from gpulaunch.schedulers.slurm import slurm_ends
from gpulaunch.supervisor.choose import Chosen, systemd_wanted
from gpulaunch.units.definitions import JobUnits, UnitDefinition
from gpulaunch.units.job import render_units
from gpulaunch.units.templates import Templates
from gpulaunch.warm.process import WarmProcess
from gpulaunch.watcher.keep import direct_likely, fork_keeper_for, job_cgroup, kept
from gpulaunch.watcher.launcher import why_signalled
from gpulaunch.watcher.limits import check_job_fits

if TYPE_CHECKING:
    from gpulaunch.base.userbus import UserManager
    from gpulaunch.leases.health import Gate
    from gpulaunch.leases.store import Lease
    from gpulaunch.multinode.peerlink import PeerLink
    from gpulaunch.supervisor.keeper import KeeperLink


def plan(opts: StartOptions, layout: Layout | None = None) -> tuple[JobSpec, JobUnits]:
    """The job and its units, decided before anything starts (bad input fails here):
    `--gpus auto:N` not leased yet (render, the checks before the start): the pool's
    first N GPUs stand in for those the lease will give (_lease)."""
    opts = stand_in(opts)
    spec = make_spec(opts, default_environment(), working_directory(), layout=layout)
    return spec, render_units(spec, Templates(opts.units_dirs))


def render(opts: StartOptions, argv: Sequence[str] = ()) -> int:
    """`gpulaunch render`: print the units `start` would create (`argv`: the command line as
    typed; `render` in it stands for `start`): the job slice, the anchor (for this process as
    the watcher), the watcher scope, the ranks slice, the rank scopes and, where `start` would
    go through the front end (gpulaunch/frontend/), its service."""
    spec, units = plan(opts)
    shown = [units.job_slice, units.anchor(os.getpid()), *units.all()[1:]]
    if _would_use_frontend(opts):
        shown.append(_launch_unit(spec, units, argv))
    for unit in shown:
        print(f"# {unit.name} (from {unit.template})")
        print(unit.text.rstrip("\n"))
        print()
    return 0


def _would_use_frontend(opts: StartOptions) -> bool:
    """Whether `start` would run the watcher as the front end's service (if the user's bus
    answers: render does not connect to it)."""
    from gpulaunch.frontend.need import needs_frontend

    return (
        opts.manager is Manager.USER
        and systemd_wanted(opts.supervisor, os.environ)
        and needs_frontend(opts.manager)
    )


def _launch_unit(spec: JobSpec, units: JobUnits, argv: Sequence[str]) -> UnitDefinition:
    """The front end's service as `start` from here would ask for it (frontend/run.py)."""
    import resource

    from gpulaunch.frontend.unit import (
        RLIMITS,
        environment,
        frontend_bus_name,
        launch_setup,
        watcher_argv,
    )

    args = list(argv)
    if "render" in args:
        args[args.index("render")] = "start"
    return units.launch(
        launch_setup(
            argv=watcher_argv(sys.executable, args, spec.job) if "start" in args else args,
            cwd=os.getcwd(),
            env=environment(os.environ)[0],
            frontend_name=frontend_bus_name(os.getpid()),
            limits={
                name: resource.getrlimit(getattr(resource, f"RLIMIT_{name}"))
                for name in RLIMITS
                if hasattr(resource, f"RLIMIT_{name}")
            },
        )
    )


def start(
    opts: StartOptions,
    view: OutputOptions,
    detach: bool = False,
    argv: Sequence[str] = (),
    frontend_child: bool = False,
    hang_options: HangOptions | None = None,
    metrics: MetricsOptions | None = None,
) -> int:
    """`gpulaunch start`: run the job to its end; returns its status. The phases, each
    owning what it makes: enter (where the watcher runs), plan (the job, once), contain
    (its supervisor), parts (what the watcher calls besides: gpulaunch/parts.py, `metrics`'
    too), run (the watcher), report (complete before any part hears `finished`, printed last).
    `argv`: the command line as typed, for the front end (gpulaunch/frontend/), which runs
    it again as a service of the user manager where that manager cannot adopt us
    (`frontend_child` there)."""
    entry = _enter(opts, view, frontend_child)
    if entry.frontend is not None:
        from gpulaunch.frontend.run import run_frontend

        spec, units = plan(opts)
        return run_frontend(spec, argv, entry.frontend, detach, units)
    hang = hang_options or HangOptions()
    job = _plan(opts, view, hang)
    detached = Detached(0, None) if detach and frontend_child else None  # the front end reads
    if detach and not frontend_child:  # our stderr when it started us; else we fork here
        detached = Detached.fork()
    if detached is not None and detached.is_parent:
        return detached.wait_started(job.spec.job)  # the child runs the watcher
    if opts.gpu_lease is not None:  # before the keeper: it holds the lease too (leases/store.py)
        opts, job = _lease(opts, job, view, hang)
    gate = open_gate(opts, job.spec)  # a GPU not fit: one line, before anything is made
    # The direct supervisor's keeper (supervisor/keeper.py): forked before anything of the
    # job exists (a multi-node job's peer too) where the direct supervisor is sure or no
    # systemd booted this machine; else once it is chosen (_contain).
    keeper = fork_keeper_for(job.spec) if direct_likely(opts.supervisor) else None
    output, journal = _open_output(view, detach, job.spec)
    wakeup = install_wakeup()
    warm = _warm(job, output)
    with ExitStack() as stack:
        if warm is not None and (keeper is not None or opts.supervisor is SupervisorKind.SYSTEMD):
            warm.start()  # now: its imports overlap the rest (no keeper is forked after it)
            stack.callback(warm.close)
        if gate is not None:
            stack.callback(gate.close)
        job = _join(job, output, wakeup, stack)
        contained = _contain(opts, job, entry, keeper, output, stack)
        parts = _parts(job, entry, contained, output, detached, metrics, gate)
        try:
            report = _run(job, contained, parts, output, journal, wakeup, warm)
        finally:
            ignore_interrupts()  # the end is decided: its status is the exit status
    print(format_report(report), file=sys.stderr, flush=True)
    return report.status


@dataclass(frozen=True)
class _Entry:
    """Where this process stands before the job is planned (`_enter`)."""

    no_bus: str = ""  # why the job API is not on D-Bus: a user manager without a user bus
    front_end: str | None = None  # our front end, when we are its watcher (frontend/tether.py)
    frontend: UserManager | None = None  # run the watcher as the front end's service of this


def _enter(opts: StartOptions, view: OutputOptions, frontend_child: bool) -> _Entry:
    """Checks that need no plan, and whether the front end runs the watcher."""
    from gpulaunch.watcher.errorfile import runtime_base, runtime_dir

    runtime_dir(runtime_base(opts.manager))  # where error files go: one line now if unusable
    if isinstance(opts.nproc, int):  # too many ranks for the open-file limit: at once (exit 2)
        check_job_fits(opts.nproc, log_dir=view.log_dir is not None)
    # A front end's identity is its watcher's alone, never a rank's (frontend/tether.py).
    front_end = os.environ.pop("GPULAUNCH_FRONTEND", None) if frontend_child else None
    if opts.manager is not Manager.USER or not systemd_wanted(opts.supervisor, os.environ):
        return _Entry(front_end=front_end)
    from gpulaunch.base.userbus import NO_BUS_LINE, find_user_manager
    from gpulaunch.frontend.need import needs_frontend

    try:
        found: UserManager | None = find_user_manager()
    except NoSystemdError:
        if opts.supervisor is SupervisorKind.SYSTEMD:
            raise
        found = None  # auto: the direct supervisor (supervisor/choose.py says why)
    no_bus = NO_BUS_LINE.format(why=found.no_bus) if found is not None and found.peer else ""
    if found is not None and not frontend_child and needs_frontend(opts.manager):
        return _Entry(no_bus, front_end, frontend=found)
    return _Entry(no_bus, front_end)


@dataclass(frozen=True)
class _Job:
    """The plan: the job (a multi-node job's ranks numbered once the nodes met) and more."""

    draft: JobDraft
    spec: JobSpec
    units: JobUnits
    hang: HangOptions
    stacks_file: Path | None  # --hang-timeout / --dump-stacks: where stacks go
    pyspy: str | None  # found now: one line, before anything starts, if it is missing
    peer: PeerLink | None = None
    lease: Lease | None = None  # --gpus auto:N: its GPUs, held by every rank too


def _plan(opts: StartOptions, view: OutputOptions, hang: HangOptions) -> _Job:
    from gpulaunch.base.nofile import raise_nofile
    from gpulaunch.debug.stacks import find_pyspy
    from gpulaunch.watcher.errorfile import runtime_base

    draft = draft_job(stand_in(opts), default_environment(), working_directory())
    spec = number_ranks(draft)
    units = render_units(spec, Templates(opts.units_dirs))
    needs = check_job_fits(spec.nproc, log_dir=view.log_dir is not None)  # exit 2 if too big
    raise_nofile(needs.fds)
    if hang.hang_timeout is None and not hang.dump_stacks:
        return _Job(draft, spec, units, hang, None, None)
    stacks_dir = view.log_dir or runtime_base(spec.manager) / "gpulaunch"
    stacks = stacks_dir / f"{spec.names.component}.stacks.txt"
    return _Job(draft, spec, units, hang, stacks, find_pyspy())


def _open_output(view: OutputOptions, detach: bool, spec: JobSpec) -> tuple[Output, bool]:
    """The terminal's owner; whether journald is reachable (the report counts its drops)."""
    from gpulaunch.logs.pump import journal_reachable

    # detached: nobody watches the terminal; the journal and --log-dir still get everything
    output = Output(replace(view, quiet=view.quiet or detach), spec.world_size)
    problem = journal_reachable()
    if problem:  # detached: nobody sees the terminal, `gpulaunch logs` reads a spool
        from gpulaunch.logs.spool import without_journald

        output.message(without_journald(output, problem, spec.job if detach else None))
    return output, problem is None


def _join(job: _Job, output: Output, wakeup: int, stack: ExitStack) -> _Job:
    """A multi-node job: meet the other nodes; the rendezvous numbers this node's ranks."""
    cfg = job.spec.node_config
    if cfg is None:
        return job
    from gpulaunch.multinode import roster
    from gpulaunch.multinode.peerlink import PeerLink
    from gpulaunch.watcher.errorfile import runtime_base, runtime_dir
    from gpulaunch.watcher.rounds import renumber

    # each round's membership, for the ranks (GPULAUNCH_MEMBERSHIP_FILE; the peer writes it)
    members = runtime_dir(runtime_base(job.spec.manager)) / f"{job.spec.job}.membership.json"
    cfg = replace(cfg, membership_file=str(members))
    peer = PeerLink.spawn(cfg, job.draft)
    stack.callback(roster.remove, str(members))
    stack.callback(peer.close)
    output.message(
        f"gpulaunch: job {job.spec.job}: waiting for {cfg.wanted} nodes at {cfg.endpoint} "
        f"({cfg.backend} rendezvous)"
    )
    from gpulaunch.jobapi import filerecord, publisher, record  # noqa: F401 - what _contain and
    from gpulaunch.progress import timeline  # noqa: F401 - _parts and _run import, now: not
    from gpulaunch.watcher import hangwatch, loop  # noqa: F401 - 0.2-1 s after the round

    with suppress(ImportError):  # after the layout (issue 27); pystemd's failure: for _contain
        from gpulaunch.supervisor import cgroups, direct, systemd, systemd_api  # noqa: F401
    spec, units = renumber(job.draft, peer.join(wakeup))
    assert spec.layout is not None
    output.place_node(spec.layout.first_rank, spec.world_size)
    return replace(job, spec=spec, units=units, peer=peer)


@dataclass(frozen=True)
class _Contained:
    """The job's supervisor, as `_contain` chose it."""

    chosen: Chosen
    manager_limits: bool  # its manager enforces the limits (else the supervisor says which not)
    unpublished: bool  # no bus to publish the job on: a record file
    keeper: int | None = None  # the direct supervisor's keeper (supervisor/keeper.py)
    why: Callable[[int], str | None] = lambda signum: None  # a signal: why (watcher/launcher.py)


def _contain(
    opts: StartOptions,
    job: _Job,
    entry: _Entry,
    keeper: KeeperLink | None,
    output: Output,
    stack: ExitStack,
) -> _Contained:
    from gpulaunch.supervisor.choose import open_supervisor

    def warn(text: str) -> None:
        output.message(f"gpulaunch: warning: {text}")

    spec = job.spec
    chosen = open_supervisor(opts.supervisor, spec, job.units, os.environ, stack, warn)
    can = chosen.supervisor.can
    if entry.no_bus and can.publishes_on_bus:
        warn(entry.no_bus)
    unpublished = not can.publishes_on_bus or bool(entry.no_bus)  # no bus: a record file
    if can.needs_keeper:
        if keeper is None and job.peer is None:  # the peer must stay the watcher's child
            keeper = fork_keeper_for(spec)
        chosen = kept(chosen, keeper, warn)  # (and what dead jobs left, ended: issue 35)
    why = why_signalled(keeper.pid if keeper else None, entry.front_end)
    return _Contained(chosen, can.manager_limits, unpublished, keeper.pid if keeper else None, why)


def _parts(
    job: _Job,
    entry: _Entry,
    contained: _Contained,
    output: Output,
    detached: Detached | None,
    metrics: MetricsOptions | None,
    gate: Gate | None,
) -> list[Part]:
    """The job's parts, in the order the watcher calls them (gpulaunch/parts.py)."""
    from gpulaunch.jobapi.filerecord import FileRecorder
    from gpulaunch.jobapi.publisher import JobPublisher
    from gpulaunch.jobapi.record import Recorder
    from gpulaunch.progress.timeline import Timeline

    def warn(text: str) -> None:
        output.message(f"gpulaunch: warning: {text}")

    spec, unpublished = job.spec, contained.unpublished
    timeline = Timeline()  # the job's goodput (progress/timeline.py), for the others to show
    output.on_line = timeline.line  # each rank's first line of each attempt (its phases)
    # the records first: Finished says they exist. Without systemd, a record file too,
    # and a bus is welcome but not needed.
    return [
        *tether_observers(entry.front_end, spec),  # first: a front end gone before it began
        timeline,  # before the records: the report they write has its goodput
        *(
            (
                FileRecorder(
                    warn,
                    cgroup=job_cgroup(contained.chosen),
                    keeper=contained.keeper,
                    goodput=timeline.now,
                    phases=timeline.phases,
                ),
            )
            if unpublished
            else ()
        ),
        Recorder(warn=(lambda _: None) if unpublished else warn),  # the file has it then
        JobPublisher(
            warn=(lambda _: None) if entry.no_bus else warn,  # the no-bus line said it
            last_output=output.last_line_at,
            optional=unpublished,
            goodput=timeline.now,
            phases=timeline.phases,
        ),
        *slurm_ends(os.environ),  # first to complete the report: which end Slurm's SIGTERM was
        *scheduler_observers(spec, warn),  # --termination-log, --gpu-job-map
        *metrics_observers(metrics, output.message, timeline.now, timeline.phases),  # --metrics-*
        GpuPart(spec, job.lease, gate),  # its lease's fds, the gate at each restart, its use
        _StartLine(spec, contained, output, detached, job.draft.opts),
    ]


class _StartLine(Part):
    """Where the job runs and what guards it, once its units exist (it may be refused)."""

    def __init__(
        self,
        spec: JobSpec,
        contained: _Contained,
        output: Output,
        detached: Detached | None,
        opts: StartOptions,
    ) -> None:
        self.spec, self.contained, self.output, self.detached = spec, contained, output, detached
        # the crash-loop rule can end the job before --max-restarts (issue 35)
        self.note = opts.recovery.restart.start_note(opts.max_restarts)

    def created(self) -> None:
        spec, chosen, output = self.spec, self.contained.chosen, self.output
        output.message(f"gpulaunch: job {spec.job}: {_where(spec, chosen.where)}")
        output.message(f"gpulaunch: job {spec.job}: {chosen.line}")
        if self.note:
            output.message(f"gpulaunch: job {spec.job}: {self.note}")
        # warnings about a job that runs: not before its units exist (it may be refused)
        _warn_about(spec, output, self.contained.manager_limits)
        if self.detached is not None:
            self.detached.started()


def _run(
    job: _Job,
    contained: _Contained,
    parts: list[Part],
    output: Output,
    journal: bool,
    wakeup: int,
    warm: WarmProcess | None,
) -> JobReport:
    """The watcher, with the job's parts, to the job's end."""
    from gpulaunch.watcher.hangwatch import HangWatch
    from gpulaunch.watcher.loop import Watcher

    hang = None
    if job.stacks_file is not None:
        hang = HangWatch(
            job.hang.hang_timeout,
            job.hang.dump_stacks,
            time.monotonic,
            lambda: output.last_data_at,
            job.stacks_file,
            pyspy=job.pyspy,
        )
    chosen = contained.chosen
    return Watcher(
        job.spec,
        chosen.supervisor,
        wakeup,
        parts,
        output=output,
        journal=journal,  # journald is reachable: the pumps write to it, the report counts
        peer=job.peer,
        hang=hang,
        recovery=_recovery(job.spec, job.draft.opts.recovery),  # by failure class, preemption
        why_signalled=contained.why,  # its launcher's death (watcher/launcher.py)
        contained_in=None if chosen.supervisor.can.makes_units else chosen.where,  # its view
        warm=warm,  # --preload (gpulaunch/warm/): started already where no keeper follows
    ).run()


def _recovery(spec: JobSpec, options: RecoveryOptions) -> RecoveryOptions:
    """A requeued Slurm job's recovery, with what its last run left in its record (read
    before this run's record replaces it: gpulaunch/jobapi/earlier.py)."""
    requeue = options.requeue
    if requeue.slurm_job is None or requeue.run == 0 or spec.layout is not None:
        return options
    from gpulaunch.jobapi.earlier import earlier_run

    carried = earlier_run(spec.job, spec.manager, os.environ)
    return replace(options, requeue=requeue.with_earlier(carried))


def _warm(job: _Job, output: Output) -> WarmProcess | None:
    """--preload: the node's warm process (gpulaunch/warm/), or None: every rank cold."""
    modules, spec = job.draft.opts.preload, job.spec
    if modules is None or not spec.ranks:
        return None
    first = spec.ranks[0]
    warm = WarmProcess(spec.job, first.argv, first.env, modules, output.message)
    if spec.node_config is not None:  # each node's ranks are renumbered by its rounds: not yet
        warm.cold = "not yet across nodes"
    return warm


def _lease(
    opts: StartOptions, job: _Job, view: OutputOptions, hang: HangOptions
) -> tuple[StartOptions, _Job]:
    """`--gpus auto:N`: lease the GPUs (held by this process until it exits, and by the
    ranks it forks: leases/part.py), and plan the same job (its id kept) on them."""
    import atexit

    from gpulaunch.leases.notes import remove_note, write_note
    from gpulaunch.leases.request import take

    assert opts.gpu_lease is not None
    opts, lease = take(replace(opts, job=job.spec.job), opts.gpu_lease, opts.wait_for_gpus)
    job = replace(_plan(opts, view, hang), lease=lease)
    atexit.register(remove_note, write_note(job.spec.job, opts.machine_root))
    return opts, job


def _warn_about(spec: JobSpec, output: Output, manager_limits: bool) -> None:
    if omp_default_applies(os.environ, spec.nproc):
        output.message(
            "gpulaunch: warning: setting OMP_NUM_THREADS=1 for each rank (torchrun's default) "
            "so that the ranks do not overload the CPUs; set it yourself to tune it"
        )
    if spec.manager is Manager.USER and any(rank.device_allow for rank in spec.ranks):
        output.message(
            "gpulaunch: warning: a user manager does not enforce --gpu-isolation's device "
            "rules: each rank sees only its GPU, but could still open the others; run as root "
            "for enforced isolation"
        )
    if manager_limits:  # else the supervisor says it itself (supervisor/direct.py)
        for text in unenforced(spec):
            output.message(f"gpulaunch: warning: {text}")


def _where(spec: JobSpec, where: str) -> str:
    """Where the job's ranks run, for the start line."""
    if spec.layout is None:
        return f"{count(spec.nproc, 'rank')} in {where}"
    first = spec.layout.first_rank
    return (
        f"node {spec.layout.node_rank} of {spec.layout.nnodes}, ranks {first}-"
        f"{first + spec.nproc - 1} of {spec.world_size} in {where}"
    )
