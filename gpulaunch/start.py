"""`gpulaunch start` and `gpulaunch render`: from start options to a finished job.

The one owner of a job's start: plan it (gpulaunch/plan/), render its units
(gpulaunch/units/), join the other nodes (gpulaunch/multinode/), choose its
supervisor (gpulaunch/supervisor/), run the watcher (gpulaunch/watcher/) with
its observers (gpulaunch/jobapi/), then print the report. cli.py parses the
command line; errors raised here become messages there.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Mapping, Sequence
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from gpulaunch.debug.options import HangOptions
from gpulaunch.errors import GpulaunchError, NoSystemdError, UsageError
from gpulaunch.logs.journal import LogDrop, rate_limit_burst, stored_lines
from gpulaunch.logs.journal import sync as journal_sync
from gpulaunch.logs.output import Output, OutputOptions
from gpulaunch.model import JobReport, JobSpec, Manager, SupervisorKind
from gpulaunch.multinode.protocol import Layout
from gpulaunch.multinode.slurm import resource_manager_step
from gpulaunch.plan.environment import omp_default_applies
from gpulaunch.plan.spec import StartOptions, default_environment, make_spec
from gpulaunch.report import count, format_report
from gpulaunch.supervisor.choose import Chosen, systemd_wanted
from gpulaunch.units.definitions import JobUnits, UnitDefinition
from gpulaunch.units.job import render_units
from gpulaunch.units.templates import Templates
from gpulaunch.watcher.detach import Detached
from gpulaunch.watcher.interrupts import ignore_interrupts, install_wakeup
from gpulaunch.watcher.observers import Observer

if TYPE_CHECKING:
    from gpulaunch.supervisor.keeper import KeeperLink


def plan(opts: StartOptions, layout: Layout | None = None) -> tuple[JobSpec, JobUnits]:
    """The job and its units, decided before anything starts (bad input fails here)."""
    spec = make_spec(opts, default_environment(), working_directory(), layout=layout)
    return spec, render_units(spec, Templates(opts.units_dirs))


def working_directory() -> str:
    """The directory the ranks start in: ours, which must still exist."""
    try:
        return os.getcwd()
    except OSError as exc:  # deleted (ENOENT), or no longer reachable (EACCES)
        raise UsageError(
            f"cannot start in this working directory: {exc.strerror} (was it deleted?)",
            "cd to a directory that exists and start again",
        ) from None


def render(opts: StartOptions, argv: Sequence[str] = ()) -> int:
    """`gpulaunch render`: print the units `start` would create: the job slice, the anchor
    (for this process as the watcher), the watcher scope, the ranks slice, the rank scopes
    and, where `start` would go through the front end (gpulaunch/frontend/), its service.

    `argv`: the command line as typed (`render` in it stands for `start`).
    """
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
) -> int:
    """`gpulaunch start`: run the job to its end; returns its status.

    `argv`: the command line as typed, for the front end (gpulaunch/frontend/),
    which runs it again as a service of the user manager where that manager cannot
    adopt us (`frontend_child` there).
    """
    from gpulaunch.watcher.errorfile import runtime_base, runtime_dir

    runtime_dir(runtime_base(opts.manager))  # where error files go: one line now if unusable
    if isinstance(opts.nproc, int):  # too many ranks for the open-file limit: at once (exit 2)
        from gpulaunch.watcher.limits import check_job_fits

        check_job_fits(opts.nproc, log_dir=view.log_dir is not None)
    no_bus = ""  # why the job API is not on D-Bus: a user manager without a user bus
    # A front end's identity is its watcher's alone, never a rank's (frontend/tether.py).
    front_end = os.environ.pop("GPULAUNCH_FRONTEND", None) if frontend_child else None
    if opts.manager is Manager.USER and systemd_wanted(opts.supervisor, os.environ):
        from gpulaunch.frontend.need import needs_frontend
        from gpulaunch.frontend.userbus import NO_BUS_LINE, UserManager, find_user_manager

        try:
            found: UserManager | None = find_user_manager()
        except NoSystemdError:
            if opts.supervisor is SupervisorKind.SYSTEMD:
                raise
            found = None  # auto: the direct supervisor (supervisor/choose.py says why)
        if found is not None and found.peer:
            no_bus = NO_BUS_LINE.format(why=found.no_bus)
        if found is not None and not frontend_child and needs_frontend(opts.manager):
            from gpulaunch.frontend.run import run_frontend

            spec, units = plan(opts)
            return run_frontend(spec, argv, found, detach, units)
    from gpulaunch.jobapi.filerecord import FileRecorder
    from gpulaunch.jobapi.publisher import JobPublisher
    from gpulaunch.jobapi.record import Recorder
    from gpulaunch.logs.pump import journal_reachable
    from gpulaunch.multinode.peerlink import PeerLink
    from gpulaunch.supervisor.choose import open_supervisor
    from gpulaunch.watcher.hangwatch import HangWatch
    from gpulaunch.watcher.limits import check_job_fits
    from gpulaunch.watcher.loop import Watcher
    from gpulaunch.watcher.nofile import raise_nofile

    spec, units = plan(opts)
    needs = check_job_fits(spec.nproc, log_dir=view.log_dir is not None)  # exit 2 if too big
    raise_nofile(needs.fds)
    hang = None
    hang_options = hang_options or HangOptions()
    if hang_options.hang_timeout is not None or hang_options.dump_stacks:
        stacks_dir = view.log_dir or runtime_base(spec.manager) / "gpulaunch"
        hang = HangWatch(  # finds py-spy now: one line, before anything starts, if it is missing
            hang_options.hang_timeout,
            hang_options.dump_stacks,
            time.monotonic,
            lambda: output.last_data_at,
            stacks_dir / f"{spec.names.component}.stacks.txt",
        )
    if frontend_child:  # already detached: the front end reads our stderr
        detached = Detached(0, None) if detach else None
    else:
        detached = Detached.fork() if detach else None
    if detached is not None and detached.is_parent:
        return detached.wait_started(spec.job)  # the child runs the watcher
    # The direct supervisor's keeper (supervisor/keeper.py): forked before anything of the
    # job exists (a multi-node job's peer too) where the direct supervisor is sure or no
    # systemd booted this machine; else once it is chosen (below).
    keeper = _fork_keeper(spec) if _direct_likely(opts.supervisor) else None
    # detached: nobody watches the terminal; the journal and --log-dir still get everything
    output = Output(replace(view, quiet=view.quiet or detach), spec.world_size)
    journal_problem = journal_reachable()
    if journal_problem:
        output.message(
            f"gpulaunch: warning: journald is not reachable ({journal_problem}); "
            "rank output goes to the terminal and --log-dir only"
        )
    wakeup = install_wakeup()
    with ExitStack() as stack:
        peer = None
        if spec.node_config is not None:
            peer = PeerLink.spawn(spec.node_config)
            stack.callback(peer.close)
            cfg = spec.node_config
            output.message(
                f"gpulaunch: job {spec.job}: waiting for {cfg.nnodes} nodes at {cfg.endpoint} "
                f"({cfg.backend} rendezvous)"
            )
            spec, units = plan(opts, layout=peer.join(wakeup))
            assert spec.layout is not None
            output.place_node(spec.layout.first_rank, spec.world_size)

        def warn(text: str) -> None:
            output.message(f"gpulaunch: warning: {text}")

        chosen = open_supervisor(opts.supervisor, spec, units, os.environ, stack, warn)
        direct = chosen.supervisor.name == "direct"
        if no_bus and not direct:
            warn(no_bus)
        unpublished = direct or bool(no_bus)  # no bus to publish the job on: a record file
        if direct:
            if keeper is None and peer is None:  # the peer must stay the watcher's child
                keeper = _fork_keeper(spec)
            chosen = _kept(chosen, keeper)

        def announce() -> None:
            output.message(f"gpulaunch: job {spec.job}: {_where(spec, chosen.where)}")
            output.message(f"gpulaunch: job {spec.job}: {chosen.line}")
            # warnings about a job that runs: not before its units exist (it may be refused)
            _warn_about(spec, output)
            if detached is not None:
                detached.started()

        def signal_ranks(signum: int, rank: int | None) -> int:
            return watcher.signal_ranks(signum, rank)

        # the records first: Finished says they exist. Without systemd, a record file too,
        # and a bus is welcome but not needed.
        observers = (
            *_tether(front_end, spec),  # first: a front end gone before it began
            *((FileRecorder(warn),) if unpublished else ()),
            Recorder(warn=(lambda _: None) if unpublished else None),  # the file has it then
            JobPublisher(
                warn=(lambda _: None) if no_bus else None,  # the no-bus line said it
                last_output=output.last_line_at,
                signal_ranks=signal_ranks,
                optional=unpublished,
            ),
        )
        started = time.time()

        def finish(report: JobReport) -> JobReport:
            """What the output knows at the end, in the report and so in the record."""
            report = replace(report, log_file_gaps=output.log_file_gaps)
            if journal_problem is None:
                missed = frozenset(r.spec.rank for r in watcher.ranks if r.journal_missed)
                crowded = frozenset(r.spec.rank for r in watcher.ranks if r.journal_crowded)
                # no units (the direct supervisor): the journal knows the ranks by their pumps
                writers = None if all(r.units for r in watcher.ranks) else watcher.pump_pids
                drops = journal_drops(spec, output, missed, started, crowded, writers)
                report = replace(report, log_drops=drops)
            return report

        watcher = Watcher(
            spec,
            chosen.supervisor,
            wakeup,
            on_created=announce,
            observers=observers,
            output=output,
            journal=journal_problem is None,
            peer=peer,
            hang=hang,
            finish=finish,
        )
        try:
            report = watcher.run()
        finally:
            ignore_interrupts()  # the end is decided: its status is the exit status
    print(format_report(report), file=sys.stderr, flush=True)
    return report.status


def _tether(front_end: str | None, spec: JobSpec) -> tuple[Observer, ...]:
    """Under a front end: the watch on its life until its bus name holds us (frontend/tether.py)."""
    if not front_end:
        return ()
    from gpulaunch.frontend.tether import FrontEndTether
    from gpulaunch.frontend.unit import service_name

    def stop_service() -> None:
        from gpulaunch.supervisor.systemd_api import Systemd

        with Systemd(Manager.USER) as systemd:
            systemd.stop_unit(service_name(spec.names))

    return (FrontEndTether(front_end, stop_service),)


def _direct_likely(kind: SupervisorKind) -> bool:
    """The direct supervisor is asked for, or sure (a Slurm step), or `auto` where systemd
    did not boot this machine (sd_booted(3): no /run/systemd/system, as in a container)."""
    if not systemd_wanted(kind, os.environ):
        return True
    return kind is SupervisorKind.AUTO and not os.path.isdir("/run/systemd/system")


def _fork_keeper(spec: JobSpec) -> KeeperLink:
    """Become the keeper (never returns) in the parent; the watcher goes on in the child."""
    from gpulaunch.supervisor.keeper import fork_keeper
    from gpulaunch.watcher.errorfile import prune_dead, runtime_base

    try:
        error_dirs: Path | None = runtime_base(spec.manager) / "gpulaunch"
    except GpulaunchError:
        error_dirs = None  # the watcher says why, once

    def at_end() -> None:  # the watcher's error-file directory, now that it is gone
        if error_dirs is not None:
            prune_dead(error_dirs)

    return fork_keeper(resource_manager_step(os.environ) is not None, at_end)


def _kept(chosen: Chosen, keeper: KeeperLink | None) -> Chosen:
    """The direct supervisor told of its keeper; the start line says what it guarantees."""
    from gpulaunch.supervisor.direct import CgroupSupervisor, ProcessGroupSupervisor

    supervisor = chosen.supervisor
    assert isinstance(supervisor, CgroupSupervisor | ProcessGroupSupervisor)
    before = supervisor.guarantees()
    supervisor.keeper = keeper
    return replace(chosen, line=supervisor.guarantees() + chosen.line.removeprefix(before))


def _warn_about(spec: JobSpec, output: Output) -> None:
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


def _where(spec: JobSpec, where: str) -> str:
    """Where the job's ranks run, for the start line."""
    if spec.layout is None:
        return f"{count(spec.nproc, 'rank')} in {where}"
    first = spec.layout.first_rank
    return (
        f"node {spec.layout.node_rank} of {spec.layout.nnodes}, ranks {first}-"
        f"{first + spec.nproc - 1} of {spec.world_size} in {where}"
    )


def journal_drops(
    spec: JobSpec,
    output: Output,
    missed: frozenset[int] = frozenset(),
    since: float = 0.0,
    crowded: frozenset[int] = frozenset(),
    writers: Mapping[int, Sequence[int]] | None = None,
) -> tuple[LogDrop, ...]:
    """Ranks of which journald kept fewer lines than they wrote.

    Its rate limit, or it was away for a while (the pumps of the ranks in
    `missed` could not hand it every line), or it was slower than the rank (the pumps of
    the ranks in `crowded` left lines out rather than hold the rank back), or it did not
    store them.
    Every rank that wrote a line is counted (never a silent loss: with the rate
    limit lifted, journald can still fail to store or keep lines); only the lines
    since `since` (time.time() at the job's start), so that an earlier job of the
    same id does not count.
    """
    burst = rate_limit_burst()
    wrote = [(rank, output.lines(rank.rank)) for rank in spec.ranks if output.lines(rank.rank)]
    if not wrote:
        return ()
    journal_sync(spec.manager)
    pids = None if writers is None else {f"rank{r}": p for r, p in writers.items()}
    stored = stored_lines(spec.manager, [(r.unit, f"rank{r.rank}") for r, _ in wrote], since, pids)
    if stored is None:
        return ()
    drops = []
    for rank, written in wrote:
        kept = stored[f"rank{rank.rank}"]
        if kept < written:
            limited = burst is not None and written > burst
            drops.append(
                LogDrop(
                    rank.rank, written, kept, rank.rank in missed, limited, rank.rank in crowded
                )
            )
    return tuple(drops)
