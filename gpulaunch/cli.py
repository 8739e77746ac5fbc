"""`gpulaunch` command line: the only place that turns errors into messages and exit codes.

Exit codes (also in the README):
  0..255  `start`: the job's status (0, the cause rank's exit code, 128+N for
          signal N; 130/143/129 when the watcher was interrupted)
  2       bad command line or input (unknown option, missing script, ...)
  3       unknown job
  69      no systemd manager reachable
  70      internal error (a bug: rerun with --debug and report it)
  71      systemd refused or failed an operation
  73      a job with this id is already running
  77      permission denied by systemd or the bus
  78      bad unit template or setting
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from gpulaunch.errors import GpulaunchError, UsageError
from gpulaunch.model import JobSpec, Manager
from gpulaunch.plan import JobUnits, StartOptions, default_environment, make_spec, render_units
from gpulaunch.report import format_report
from gpulaunch.units import Templates

INTERNAL_ERROR = 70


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (and exit code 2)."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(message, f"see '{self.prog} --help'")


def _positive_float(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None


def _add_start_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--nproc",
        "--nproc-per-node",
        dest="nproc",
        type=int,
        default=1,
        metavar="N",
        help="number of ranks to start on this machine (default: 1)",
    )
    p.add_argument(
        "--job", metavar="NAME", help="job id (default: the script's name plus a random suffix)"
    )
    p.add_argument(
        "--master-addr",
        default="127.0.0.1",
        metavar="ADDR",
        help="rank 0's address (default: 127.0.0.1)",
    )
    p.add_argument(
        "--master-port", type=int, metavar="PORT", help="rank 0's port (default: a free port)"
    )
    p.add_argument(
        "--grace",
        type=_positive_float,
        default=10.0,
        metavar="SECONDS",
        help="time between SIGTERM and SIGKILL when ranks are stopped (default: 10)",
    )
    p.add_argument("--memory-max", metavar="BYTES", help="memory limit of each rank (MemoryMax=)")
    p.add_argument(
        "--units-dir",
        action="append",
        type=Path,
        default=[],
        metavar="DIR",
        help="look for unit templates here first (repeatable)",
    )
    manager = p.add_mutually_exclusive_group()
    manager.add_argument(
        "--system",
        dest="manager",
        action="store_const",
        const=Manager.SYSTEM,
        help="use the system manager (default as root)",
    )
    manager.add_argument(
        "--user",
        dest="manager",
        action="store_const",
        const=Manager.USER,
        help="use your user manager (default when not root)",
    )
    p.add_argument("script", help="the training script (run with this Python)")
    p.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the script")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="gpulaunch", description="Distributed PyTorch ranks supervised by systemd."
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks of errors")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    start = sub.add_parser("start", help="run a job: one rank per process, each a systemd scope")
    _add_start_options(start)
    start.set_defaults(func=cmd_start)
    render = sub.add_parser("render", help="print the units that `start` would create")
    _add_start_options(render)
    render.set_defaults(func=cmd_render)
    return parser


def start_options(args: argparse.Namespace) -> StartOptions:
    manager = args.manager or (Manager.SYSTEM if os.geteuid() == 0 else Manager.USER)
    return StartOptions(
        script=args.script,
        args=tuple(args.args),
        nproc=args.nproc,
        job=args.job,
        master_addr=args.master_addr,
        master_port=args.master_port,
        grace_sec=args.grace,
        manager=manager,
        memory_max=args.memory_max,
        units_dirs=tuple(args.units_dir),
    )


def _plan(args: argparse.Namespace) -> tuple[JobSpec, JobUnits]:
    opts = start_options(args)
    spec = make_spec(opts, default_environment(), os.getcwd())
    return spec, render_units(spec, Templates(opts.units_dirs))


def cmd_render(args: argparse.Namespace) -> int:
    _, units = _plan(args)
    for unit in units.all():
        print(f"# {unit.name} (from {unit.template})")
        print(unit.text.rstrip("\n"))
        print()
    return 0


def _signal_wakeup() -> int:
    """Signals become bytes on a socket that the watcher's loop selects on."""
    read_end, write_end = socket.socketpair()
    for sock in (read_end, write_end):
        sock.setblocking(False)
    signal.set_wakeup_fd(write_end.detach(), warn_on_full_buffer=False)
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, lambda *_: None)
    return read_end.detach()


def cmd_start(args: argparse.Namespace) -> int:
    from gpulaunch.systemd import Systemd  # pystemd is only needed to run jobs
    from gpulaunch.watcher import Watcher

    spec, units = _plan(args)
    wakeup = _signal_wakeup()

    def announce() -> None:
        print(
            f"gpulaunch: job {spec.job}: {spec.nproc} ranks in {spec.names.job_slice}",
            file=sys.stderr,
            flush=True,
        )

    with Systemd(spec.manager) as sd:
        report = Watcher(spec, units, sd, wakeup, on_created=announce).run()
    print(format_report(report), file=sys.stderr, flush=True)
    return report.status


def main(argv: Sequence[str] | None = None) -> NoReturn:
    parser = build_parser()
    debug = "--debug" in (sys.argv[1:] if argv is None else argv)
    try:
        args = parser.parse_args(argv)
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
