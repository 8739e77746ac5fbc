"""`gpulaunch` command line: the only place that turns errors into messages and exit codes.

Exit codes (also in the README):
  0..255  `start`, `wait`: the job's status (0, the cause rank's exit code, 128+N
          for signal N; 130/143/129 when the watcher was interrupted)
  2       bad command line or input (unknown option, missing script, ...)
  3       unknown job
  68      a multi-node job could not join its other nodes (the rendezvous failed)
  69      no systemd manager reachable
  70      internal error (a bug: rerun with --debug and report it)
  71      systemd refused or failed an operation
  73      a job with this id is already running
  75      multi-node: the job stopped because another node was lost (its watcher died,
          it stopped answering, or the store it served went away)
  76      the job's watcher went away without saying how the job ended (`wait`, `stop`)
  77      permission denied by systemd or the bus
  78      bad unit template or setting
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path
from typing import NoReturn

from gpulaunch.errors import GpulaunchError, UsageError
from gpulaunch.jobapi import commands as jobctl
from gpulaunch.logs.journal import LogDrop, add_logs_parser, rate_limit_burst, stored_lines
from gpulaunch.logs.journal import sync as journal_sync
from gpulaunch.logs.output import Output, OutputOptions, parse_ranks
from gpulaunch.model import JobSpec, Manager
from gpulaunch.multinode.options import NodeOptions
from gpulaunch.multinode.protocol import Layout
from gpulaunch.options import add_manager_options, manager_of
from gpulaunch.plan.environment import omp_default_applies
from gpulaunch.plan.gpus import parse_gpu_list
from gpulaunch.plan.placement import Resources
from gpulaunch.plan.spec import (
    JobUnits,
    Launch,
    StartOptions,
    default_environment,
    make_spec,
    render_units,
)
from gpulaunch.plan.topology import CpuBind
from gpulaunch.report import count, format_report
from gpulaunch.units.templates import Templates
from gpulaunch.watcher.detach import Detached
from gpulaunch.watcher.interrupts import install_wakeup

INTERNAL_ERROR = 70


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (and exit code 2)."""

    def error(self, message: str) -> NoReturn:
        if message.startswith("unrecognized arguments:") and "--debug" in message.split():
            raise UsageError(
                message, "--debug goes before the command: gpulaunch --debug start ..."
            )
        raise UsageError(message, f"see '{self.prog} --help'")


def _positive_float(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None


def _nproc(text: str) -> int | str:
    if text in ("gpu", "cpu", "auto"):
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number, gpu, cpu or auto: {text!r}") from None


# torchrun options gpulaunch does not take, and what to do instead.
# tests/unit/test_cli.py checks against torch.distributed.run's own parser that every
# torchrun option is either taken or here.
TORCHRUN_ONLY = {
    ("-t", "--tee"): "every rank's output is shown live anyway: choose ranks with --ranks, "
    "write files with --log-dir",
    ("-r", "--redirects"): "rank output always goes to the journal (gpulaunch logs JOB) and "
    "the terminal; use --quiet or --log-dir",
    ("--duplicate-stdout-filters", "--duplicate_stdout_filters"): "--log-dir writes every "
    "rank's output to a file of its own; gpulaunch logs JOB --rank N reads one back",
    ("--duplicate-stderr-filters", "--duplicate_stderr_filters"): "--log-dir writes every "
    "rank's output to a file of its own; gpulaunch logs JOB --rank N reads one back",
    ("--event-log-handler", "--event_log_handler"): "gpulaunch's events are on D-Bus and its "
    "record in the journal (docs/dbus.md)",
    ("--virtual-local-rank", "--virtual_local_rank"): "use --gpu-isolation: each rank sees "
    "only its own GPU, as cuda:0",
    ("--monitor-interval", "--monitor_interval"): "gpulaunch has no polling interval: it "
    "sees every exit at once",
    ("--start-method", "--start_method"): "ranks are always forked and exec'd, each in "
    "its own systemd scope",
    ("--role",): "roles are not supported; ROLE_NAME is 'default'",
    ("--logs-specs", "--logs_specs"): "use --log-dir",
    ("--numa-binding", "--numa_binding"): "use --cpu-bind numa",
    ("--signals-to-handle", "--signals_to_handle"): "SIGINT, SIGTERM and SIGHUP stop the "
    "job through systemd",
}


class _Refuse(argparse.Action):
    """A torchrun option we do not take: one line saying what to use instead."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: object,
        option_string: str | None = None,
    ) -> None:
        advice = next(a for flags, a in TORCHRUN_ONLY.items() if option_string in flags)
        raise UsageError(f"{option_string} is a torchrun option gpulaunch does not take", advice)


def _add_torchrun_options(p: argparse.ArgumentParser) -> None:
    """torchrun's flags with the same meaning, and its others refused with advice."""
    p.add_argument(
        "--standalone",
        action="store_true",
        help="accepted for torchrun compatibility: every gpulaunch job is standalone",
    )
    launch = p.add_mutually_exclusive_group()
    launch.add_argument(
        "-m",
        "--module",
        dest="launch",
        action="store_const",
        const=Launch.MODULE,
        help="run SCRIPT as a module: python -m SCRIPT",
    )
    launch.add_argument(
        "--no-python",
        "--no_python",
        dest="launch",
        action="store_const",
        const=Launch.NO_PYTHON,
        help="run SCRIPT as a program, not with python",
    )
    launch.add_argument(
        "--run-path",
        "--run_path",
        dest="launch",
        action="store_const",
        const=Launch.RUN_PATH,
        help="run SCRIPT with runpy.run_path",
    )
    p.add_argument(
        "--max-restarts",
        "--max_restarts",
        type=int,
        default=0,
        metavar="N",
        help="restart all ranks up to N times after a failure (default: 0)",
    )
    _add_node_options(p)
    for flags in TORCHRUN_ONLY:
        p.add_argument(*flags, action=_Refuse, nargs="?", help=argparse.SUPPRESS)


def _add_node_options(p: argparse.ArgumentParser) -> None:
    """torchrun's multi-node flags (docs/multinode.md); under srun, SLURM's variables."""
    g = p.add_argument_group("multi-node (one gpulaunch per node; see docs/multinode.md)")
    g.add_argument("--nnodes", metavar="N", help="nodes in the job (default: 1, or SLURM's)")
    g.add_argument(
        "--node-rank",
        "--node_rank",
        type=int,
        metavar="R",
        help="this node's rank, static rendezvous (default: 0, or SLURM_NODEID)",
    )
    g.add_argument(
        "--rdzv-backend",
        "--rdzv_backend",
        metavar="NAME",
        help="static (default: --master-addr/--master-port) or c10d (--rdzv-endpoint)",
    )
    g.add_argument(
        "--rdzv-endpoint",
        "--rdzv_endpoint",
        metavar="HOST[:PORT]",
        help="the rendezvous store, the same on every node",
    )
    g.add_argument(
        "--rdzv-id",
        "--rdzv_id",
        metavar="ID",
        help="the job's id among the nodes (default: the job id, the same on every node)",
    )
    g.add_argument(
        "--rdzv-conf", "--rdzv_conf", metavar="K=V,...", help="options for torch's rendezvous"
    )
    g.add_argument(
        "--local-addr",
        "--local_addr",
        metavar="ADDR",
        help="this node's address as the other nodes reach it (default: its FQDN)",
    )


def _add_start_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--nproc",
        "--nproc-per-node",
        "--nproc_per_node",
        dest="nproc",
        type=_nproc,
        metavar="N",
        help="ranks on this machine: a number, gpu, cpu or auto (default: one per --gpus GPU, "
        "else 1)",
    )
    p.add_argument(
        "--job", metavar="NAME", help="job id (default: the script's name plus a random suffix)"
    )
    p.add_argument(
        "--master-addr",
        "--master_addr",
        metavar="ADDR",
        help="rank 0's address (default: 127.0.0.1; multi-node: node 0's, which serves the "
        "static rendezvous)",
    )
    p.add_argument(
        "--master-port",
        "--master_port",
        type=int,
        metavar="PORT",
        help="rank 0's port (default: a free port; multi-node static: 29500)",
    )
    p.add_argument(
        "--grace",
        "--shutdown-timeout",
        "--shutdown_timeout",
        dest="grace",
        type=_positive_float,
        default=10.0,
        metavar="SECONDS",
        help="time between SIGTERM and SIGKILL when ranks are stopped (default: 10)",
    )
    p.add_argument("--memory-max", metavar="BYTES", help="memory limit of each rank (MemoryMax=)")
    _add_placement_options(p)
    p.add_argument(
        "--units-dir",
        action="append",
        type=Path,
        default=[],
        metavar="DIR",
        help="look for unit templates here first (repeatable)",
    )
    add_manager_options(p, "the job's units")
    p.add_argument("script", help="the training script (run with this Python)")
    p.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the script")


def _gpu_list(text: str) -> tuple[int, ...]:
    try:
        return parse_gpu_list(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{exc}; use e.g. 0,2,3 or 0-3") from None


def _add_placement_options(p: argparse.ArgumentParser) -> None:
    """GPUs and CPUs per rank (gpulaunch/plan/placement.py)."""
    p.add_argument(
        "--cpus-per-rank",
        type=int,
        metavar="N",
        help="give each rank N CPUs of its own (AllowedCPUs=), whole cores first",
    )
    p.add_argument(
        "--cpu-bind",
        choices=[bind.value for bind in CpuBind],
        default=CpuBind.NONE.value,
        help="numa: each rank gets CPUs of its GPU's NUMA node (default: none)",
    )
    p.add_argument(
        "--gpus",
        type=_gpu_list,
        metavar="LIST",
        help="the GPUs to use, e.g. 0,2,3, counted in CUDA_VISIBLE_DEVICES; one rank each",
    )
    p.add_argument(
        "--gpu-isolation",
        action="store_true",
        help="each rank sees and may open only its own GPU (DevicePolicy=closed)",
    )
    # A test stand-in, not for users: GPUs from DIR/proc/driver/nvidia, CPUs from DIR/sys.
    p.add_argument("--machine-root", type=Path, metavar="DIR", help=argparse.SUPPRESS)


def _rank_set(text: str) -> frozenset[int]:
    try:
        return parse_ranks(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{exc}; use e.g. 0 or 0,3 or 0-3") from None


def _add_output_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--ranks",
        "--local-ranks-filter",
        "--local_ranks_filter",
        dest="ranks",
        type=_rank_set,
        metavar="LIST",
        help="show only these ranks' output live, e.g. 0 or 0,3 or 0-3 (the journal gets all; "
        "on several nodes: this node's ranks, counted from 0)",
    )
    p.add_argument(
        "--quiet", "-q", action="store_true", help="show no rank output live, only the report"
    )
    p.add_argument(
        "--log-dir",
        "--log_dir",
        dest="log_dir",
        type=Path,
        metavar="DIR",
        help="also write each rank's output to DIR/rankN.log, stdout and stderr as they came "
        "(not torchrun's DIR/<run id>/attempt_<n>/<rank>/{stdout,stderr}.log)",
    )


# For `start --help`: the module docstring's table, as the README has it.
START_EXIT_CODES = "exit status:\n" + (__doc__ or "").partition("(also in the README):\n")[2]


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="gpulaunch", description="Distributed PyTorch ranks supervised by systemd."
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks of errors")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    start = sub.add_parser(
        "start",
        help="run a job: one rank per process, each a systemd scope",
        epilog=START_EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_start_options(start)
    _add_torchrun_options(start)
    _add_output_options(start)
    start.add_argument(
        "--detach", "-d", action="store_true", help="print the job id and return; the job runs on"
    )
    start.set_defaults(func=cmd_start)
    render = sub.add_parser("render", help="print the units that `start` would create")
    _add_start_options(render)
    _add_torchrun_options(render)
    render.set_defaults(func=cmd_render)
    add_logs_parser(sub)
    jobctl.add_parsers(sub)
    return parser


def start_options(args: argparse.Namespace) -> StartOptions:
    manager = manager_of(args)
    return StartOptions(
        script=args.script,
        args=tuple(args.args),
        nproc=args.nproc if args.nproc is not None else (len(args.gpus) if args.gpus else 1),
        job=args.job,
        master_addr=args.master_addr,
        master_port=args.master_port,
        grace_sec=args.grace,
        manager=manager,
        memory_max=args.memory_max,
        units_dirs=tuple(args.units_dir),
        resources=Resources(
            gpus=args.gpus,
            gpu_isolation=args.gpu_isolation,
            cpus_per_rank=args.cpus_per_rank,
            cpu_bind=CpuBind(args.cpu_bind),
        ),
        machine_root=args.machine_root,
        launch=args.launch or Launch.SCRIPT,
        max_restarts=args.max_restarts,
        nodes=NodeOptions(
            nnodes=args.nnodes,
            node_rank=args.node_rank,
            rdzv_backend=args.rdzv_backend,
            rdzv_endpoint=args.rdzv_endpoint,
            rdzv_id=args.rdzv_id,
            rdzv_conf=args.rdzv_conf,
            local_addr=args.local_addr,
        ),
    )


def _plan(args: argparse.Namespace, layout: Layout | None = None) -> tuple[JobSpec, JobUnits]:
    opts = start_options(args)
    spec = make_spec(opts, default_environment(), os.getcwd(), layout=layout)
    return spec, render_units(spec, Templates(opts.units_dirs))


def cmd_render(args: argparse.Namespace) -> int:
    _, units = _plan(args)
    for unit in units.all():
        print(f"# {unit.name} (from {unit.template})")
        print(unit.text.rstrip("\n"))
        print()
    return 0


def cmd_start(args: argparse.Namespace) -> int:
    from gpulaunch.jobapi.publisher import JobPublisher
    from gpulaunch.jobapi.record import Recorder
    from gpulaunch.logs.pump import journal_reachable
    from gpulaunch.multinode.peerlink import PeerLink
    from gpulaunch.supervisor.systemd_api import Systemd  # pystemd is only needed to run jobs
    from gpulaunch.watcher.loop import Watcher

    spec, units = _plan(args)
    detached = Detached.fork() if args.detach else None
    if detached is not None and detached.is_parent:
        return detached.wait_started(spec.job)  # the child runs the watcher
    output = Output(
        # detached: nobody watches the terminal; the journal and --log-dir still get everything
        OutputOptions(ranks=args.ranks, quiet=args.quiet or args.detach, log_dir=args.log_dir),
        spec.world_size,
    )
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
            spec, units = _plan(args, layout=peer.join(wakeup))
            assert spec.layout is not None
            output.place_node(spec.layout.first_rank, spec.world_size)

        def announce() -> None:
            where = f"{count(spec.nproc, 'rank')} in {spec.names.job_slice}"
            if spec.layout is not None:
                first = spec.layout.first_rank
                where = (
                    f"node {spec.layout.node_rank} of {spec.layout.nnodes}, ranks {first}-"
                    f"{first + spec.nproc - 1} of {spec.world_size} in {spec.names.job_slice}"
                )
            output.message(f"gpulaunch: job {spec.job}: {where}")
            # warnings about a job that runs: not before its units exist (it may be refused)
            if omp_default_applies(os.environ, spec.nproc):
                output.message(
                    "gpulaunch: warning: setting OMP_NUM_THREADS=1 for each rank (torchrun's "
                    "default) so that the ranks do not overload the CPUs; set it yourself to "
                    "tune it"
                )
            if spec.manager is Manager.USER and any(rank.device_allow for rank in spec.ranks):
                output.message(
                    "gpulaunch: warning: a user manager does not enforce --gpu-isolation's device "
                    "rules: each rank sees only its GPU, but could still open the others; run as "
                    "root for enforced isolation"
                )
            if detached is not None:
                detached.started()

        sd = stack.enter_context(Systemd(spec.manager))
        watcher = Watcher(
            spec,
            units,
            sd,
            wakeup,
            on_created=announce,
            observers=(Recorder(), JobPublisher()),  # the record first: Finished says it exists
            output=output,
            journal=journal_problem is None,
            peer=peer,
        )
        report = watcher.run()
    if journal_problem is None:
        report = replace(report, log_drops=journal_drops(spec, output))
    print(format_report(report), file=sys.stderr, flush=True)
    return report.status


def journal_drops(spec: JobSpec, output: Output) -> tuple[LogDrop, ...]:
    """Ranks of which journald kept fewer lines than they wrote (its rate limit)."""
    burst = rate_limit_burst()
    if burst is None:
        return ()
    drops = []
    synced = False
    for rank in spec.ranks:
        written = output.lines(rank.rank)
        if written <= burst:
            continue  # the limit cannot have been reached
        if not synced:
            journal_sync(spec.manager)
            synced = True
        stored = stored_lines(spec.manager, rank.unit, f"rank{rank.rank}")
        if stored < written:
            drops.append(LogDrop(rank=rank.rank, written=written, stored=stored))
    return tuple(drops)


def main(argv: Sequence[str] | None = None) -> NoReturn:
    parser = build_parser()
    debug = False  # a bad command line is never worth a traceback
    try:
        args = parser.parse_args(argv)
        debug = bool(args.debug)
        code = int(args.func(args))
    except GpulaunchError as exc:
        if debug:
            traceback.print_exc()
        hint = f"; {exc.hint}" if exc.hint else ""
        print(f"gpulaunch: error: {exc.message}{hint}", file=sys.stderr)
        code = exc.exit_code
    except Exception as exc:  # a bug: say so in one line, traceback with --debug
        if debug:
            traceback.print_exc()
        print(
            f"gpulaunch: internal error: {type(exc).__name__}: {exc}; "
            "rerun with --debug and report it",
            file=sys.stderr,
        )
        code = INTERNAL_ERROR
    sys.stdout.flush()
    sys.exit(code)
