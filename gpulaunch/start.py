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
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import replace

from gpulaunch.debug.options import HangOptions
from gpulaunch.errors import NoSystemdError
from gpulaunch.logs.journal import LogDrop, rate_limit_burst, stored_lines
from gpulaunch.logs.journal import sync as journal_sync
from gpulaunch.logs.output import Output, OutputOptions
from gpulaunch.model import JobSpec, Manager, SupervisorKind
from gpulaunch.multinode.protocol import Layout
from gpulaunch.plan.environment import omp_default_applies
from gpulaunch.plan.spec import StartOptions, default_environment, make_spec
from gpulaunch.report import count, format_report
from gpulaunch.resources.controllers import unenforced
from gpulaunch.supervisor.choose import systemd_wanted
from gpulaunch.units.definitions import JobUnits
from gpulaunch.units.job import render_units
from gpulaunch.units.templates import Templates
from gpulaunch.watcher.detach import Detached
from gpulaunch.watcher.interrupts import ignore_interrupts, install_wakeup


def plan(opts: StartOptions, layout: Layout | None = None) -> tuple[JobSpec, JobUnits]:
    """The job and its units, decided before anything starts (bad input fails here)."""
    spec = make_spec(opts, default_environment(), os.getcwd(), layout=layout)
    return spec, render_units(spec, Templates(opts.units_dirs))


def render(opts: StartOptions) -> int:
    """`gpulaunch render`: print the units `start` would create."""
    _, units = plan(opts)
    for unit in units.all():
        print(f"# {unit.name} (from {unit.template})")
        print(unit.text.rstrip("\n"))
        print()
    return 0


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
    if opts.manager is Manager.USER and systemd_wanted(opts.supervisor, os.environ):
        from gpulaunch.frontend.need import needs_frontend
        from gpulaunch.frontend.userbus import ensure_user_bus

        try:
            address: str | None = ensure_user_bus()
        except NoSystemdError:
            if opts.supervisor is SupervisorKind.SYSTEMD:
                raise
            address = None  # auto: the direct supervisor (supervisor/choose.py says why)
        if address is not None and not frontend_child and needs_frontend(opts.manager):
            from gpulaunch.frontend.run import run_frontend

            return run_frontend(plan(opts)[0], argv, address, detach)
    from gpulaunch.jobapi.filerecord import FileRecorder
    from gpulaunch.jobapi.publisher import JobPublisher
    from gpulaunch.jobapi.record import Recorder
    from gpulaunch.logs.pump import journal_reachable
    from gpulaunch.multinode.peerlink import PeerLink
    from gpulaunch.supervisor.choose import open_supervisor
    from gpulaunch.watcher.errorfile import runtime_base
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

        def announce() -> None:
            output.message(f"gpulaunch: job {spec.job}: {_where(spec, chosen.where)}")
            output.message(f"gpulaunch: job {spec.job}: {chosen.line}")
            # warnings about a job that runs: not before its units exist (it may be refused)
            _warn_about(spec, output, direct)
            if detached is not None:
                detached.started()

        def signal_ranks(signum: int, rank: int | None) -> int:
            return watcher.signal_ranks(signum, rank)

        # the records first: Finished says they exist. Without systemd, a record file too,
        # and a bus is welcome but not needed.
        observers = (
            *((FileRecorder(warn),) if direct else ()),
            Recorder(warn=(lambda _: None) if direct else None),  # the file has it then
            JobPublisher(
                last_output=output.last_line_at, signal_ranks=signal_ranks, optional=direct
            ),
        )
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
        )
        try:
            report = watcher.run()
        finally:
            ignore_interrupts()  # the end is decided: its status is the exit status
    report = replace(report, log_file_gaps=output.log_file_gaps)
    if journal_problem is None:
        missed = frozenset(r.spec.rank for r in watcher.ranks if r.journal_missed)
        report = replace(report, log_drops=journal_drops(spec, output, missed))
    print(format_report(report), file=sys.stderr, flush=True)
    return report.status


def _warn_about(spec: JobSpec, output: Output, direct: bool) -> None:
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
    if not direct:  # the direct supervisor says it itself (supervisor/direct.py)
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


def journal_drops(
    spec: JobSpec, output: Output, missed: frozenset[int] = frozenset()
) -> tuple[LogDrop, ...]:
    """Ranks of which journald kept fewer lines than they wrote.

    Its rate limit, or it was away for a while: the pumps of the ranks in
    `missed` could not hand it every line.
    """
    burst = rate_limit_burst()
    drops = []
    synced = False
    for rank in spec.ranks:
        written = output.lines(rank.rank)
        if (burst is None or written <= burst) and rank.rank not in missed:
            continue  # the limit cannot have been reached
        if not synced:
            journal_sync(spec.manager)
            synced = True
        stored = stored_lines(spec.manager, rank.unit, f"rank{rank.rank}")
        if stored < written:
            drops.append(LogDrop(rank.rank, written, stored, unreachable=rank.rank in missed))
    return tuple(drops)
