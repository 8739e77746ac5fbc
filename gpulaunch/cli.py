"""`gpulaunch` command line: the only place that turns errors into messages and exit codes.

Exit codes: gpulaunch/errors.py (and the README).
"""

from __future__ import annotations

import argparse
import os
import select
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from gpulaunch import __version__
from gpulaunch.base.argtext import not_utf8, printable
from gpulaunch.debug.options import HangOptions, add_hang_options
from gpulaunch.errors import GpulaunchError, UsageError
from gpulaunch.frontend.argv import unpack_argv
from gpulaunch.metrics.options import add_metrics_options, metrics_options
from gpulaunch.options import (
    add_manager_options,
    add_output_options,
    add_start_options,
    add_torchrun_options,
    default_manager,
    forgot_start,
    output_options,
    start_options,
)

INTERNAL_ERROR = 70


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (and exit code 2)."""

    def error(self, message: str) -> NoReturn:
        if message.startswith("unrecognized arguments:") and "--debug" in message.split():
            raise UsageError(
                message, "--debug goes before the command: gpulaunch --debug start ..."
            )
        raise UsageError(message, f"see '{self.prog} --help'")

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        """A script's arguments are the script's: `start ... train.py --preempt` passes
        `--preempt` on, though argparse alone would read it as an abbreviation of ours
        (and stop at "ambiguous option")."""
        words = list(sys.argv[1:] if args is None else args)
        at = _script_at(self, words)
        if at is None:
            return super().parse_known_args(words, namespace)
        parsed, extra = super().parse_known_args(words[: at + 1], namespace)
        parsed.args = words[at + 1 :]
        return parsed, extra


def _script_at(parser: argparse.ArgumentParser, words: list[str]) -> int | None:
    """Where the script is among `words`, for a parser with a script; None where there
    is none, or where argparse should say what is wrong before it."""
    if not any(a.dest == "script" for a in parser._actions if not a.option_strings):
        return None
    options = parser._option_string_actions
    i = 0
    while i < len(words):
        word = words[i]
        if word == "--":
            return i + 1 if i + 1 < len(words) else None
        if word == "-" or not word.startswith("-"):
            return i
        name, eq, _ = word.partition("=")
        action = options.get(name)
        if action is None and name.startswith("--"):
            found = {id(a): a for s, a in options.items() if s.startswith(name)}
            action = next(iter(found.values())) if len(found) == 1 else None
        elif action is None and not eq and options.get(word[:2]) is not None:
            action, eq = options[word[:2]], "="  # -n4: the value is attached
        if action is None:
            return None
        i += 1
        if eq or action.nargs == 0:
            continue
        if action.nargs == "?":
            i += i < len(words) and not words[i].startswith("-")
        elif isinstance(action.nargs, int) or action.nargs is None:
            i += 1 if action.nargs is None else action.nargs
        else:
            return None
    return None


def _start_exit_codes() -> str:
    """For `start --help`: the table of gpulaunch/errors.py, as the README has it."""
    from gpulaunch import errors

    return "exit status:\n" + (errors.__doc__ or "").partition("Exit codes:\n")[2]


def _add_job_commands(sub: Any) -> None:
    """list, status, stop, wait (jobapi/commands.py), top (resources/), logs (logs/command.py)."""
    p = sub.add_parser("list", help="list running jobs (--all: and recently finished ones)")
    p.add_argument(
        "--all", "-a", action="store_true", help="also show jobs that ended (from the journal)"
    )
    p.add_argument(
        "--limit",
        type=int,
        default=20,
        metavar="N",
        help="with --all: how many ended jobs at most (default: 20)",
    )
    add_manager_options(p, user_of=True)
    p.add_argument("--json", action="store_true", help="print JSON (for scripts)")
    p.set_defaults(func=_cmd_list)

    p = sub.add_parser("status", help="a job's ranks and states, or its final report")
    p.add_argument("job", metavar="JOB")
    add_manager_options(p, user_of=True)
    p.add_argument("--json", action="store_true", help="print JSON (for scripts)")
    p.add_argument(
        "--resources",
        action="store_true",
        help="a running job: also each rank's CPU, memory, processes, GPU and last output "
        "(measured over 1 s)",
    )
    p.set_defaults(func=_cmd_status)
    p = sub.add_parser("top", help="running jobs' ranks live: CPU, memory, GPU, last output")
    p.add_argument("job", metavar="JOB", nargs="?", help="only this job (default: every job)")
    p.add_argument(
        "--interval",
        type=_interval,
        default=2.0,
        metavar="SECONDS",
        help="redraw every SECONDS (default 2; CPU %% is measured over it)",
    )
    p.add_argument(
        "--once", action="store_true", help="print one table and exit (so does a non-terminal)"
    )
    add_manager_options(p, user_of=True)
    p.set_defaults(func=_cmd_top)

    p = sub.add_parser("stop", help="stop a job gracefully (its owner or root)")
    p.add_argument("job", metavar="JOB")
    p.add_argument(
        "--no-block", action="store_true", help="return once the stop was accepted, do not wait"
    )
    add_manager_options(p, user_of=True)
    p.set_defaults(func=_cmd_stop)

    p = sub.add_parser("wait", help="wait until a job ends; exit with its status")
    p.add_argument("job", metavar="JOB")
    add_manager_options(p, user_of=True)
    p.set_defaults(func=_cmd_wait)

    p = sub.add_parser(
        "signal",
        help="pass SIGUSR1 or SIGUSR2 on to a job's ranks (the job goes on), or SIGTERM or "
        "SIGINT to its watcher (the job stops, as on that signal)",
    )
    p.add_argument("job", metavar="JOB")
    p.add_argument(
        "signal", type=_notice, metavar="SIG", help="USR1, USR2, TERM or INT (SIGUSR1, 10, ...)"
    )
    p.add_argument("--rank", type=_rank_number, metavar="N", help="only this (global) rank")
    add_manager_options(p, user_of=True)
    p.set_defaults(func=_cmd_signal)

    p = sub.add_parser("logs", help="show a job's rank output from the journal")
    p.add_argument("job", help="the job id")
    p.add_argument("--rank", type=_rank_number, metavar="N", help="only this rank")
    p.add_argument(
        "-f",
        "--follow",
        action="store_true",
        help="keep showing new lines until the job ends; then print its report and exit "
        "with its status, as 'gpulaunch wait'",
    )
    p.add_argument("--since", metavar="TIME", help="only lines since TIME (journalctl --since)")
    p.add_argument(
        "-n", "--lines", type=int, metavar="N", help="only the last N lines (default: all)"
    )
    add_manager_options(p, "logs")
    p.set_defaults(func=_cmd_logs)


def _notice(text: str) -> int:
    """SIGUSR1 or SIGUSR2 (notices), or SIGTERM or SIGINT (stops), by name (with or without
    SIG) or number."""
    import signal

    name = text.upper().removeprefix("SIG")
    for notice in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM, signal.SIGINT):
        if name in (notice.name.removeprefix("SIG"), str(int(notice))):
            return int(notice)
    raise argparse.ArgumentTypeError(
        f"{text!r} is not a notice (USR1, USR2) or a stop (TERM, INT); 'gpulaunch stop' stops a job"
    )


def _rank_number(text: str) -> int:
    """A (global) rank: 0 to 2**31-1 (an int32, in torch and on D-Bus)."""
    from gpulaunch.plan.bounds import MAX_RANK

    try:
        number = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a rank number: {text!r}") from None
    if not 0 <= number <= MAX_RANK:
        raise argparse.ArgumentTypeError(f"must be between 0 and {MAX_RANK}, not {text}")
    return number


def _interval(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not 0.1 <= value <= 3600:
        raise argparse.ArgumentTypeError(f"not between 0.1 and 3600 seconds: {text!r}")
    return value


def _root_dir(text: str) -> Path:
    """`setup --root DIR`: an empty one is a mistake (Path("") is ".", the current one)."""
    if not text:
        raise argparse.ArgumentTypeError("an empty path: give a directory (--root . for this one)")
    return Path(text)


def _add_system_commands(sub: Any) -> None:
    """setup and doctor (gpulaunch/system/)."""
    p = sub.add_parser(
        "setup",
        help="install the system side (root): the D-Bus policy; --journald: the log rate limit",
        description="Install what the system side of gpulaunch needs, from this package: "
        "the D-Bus policy of the job API, gpulaunch.slice (settings for all jobs, none set) and "
        "the tmpfiles.d entry of /run/gpulaunch, and with --journald journald's rate-limit "
        "drop-in. "
        "Idempotent; --uninstall removes it all.",
    )
    p.add_argument(
        "--journald",
        action="store_true",
        help="also install journald's rate-limit drop-in: journald keeps every rank's line",
    )
    p.add_argument(
        "--restart-journald",
        action="store_true",
        help="restart systemd-journald so that the drop-in applies now (implies --journald)",
    )
    p.add_argument("--uninstall", action="store_true", help="remove what setup installed")
    p.add_argument(
        "--root",
        type=_root_dir,
        metavar="DIR",
        help="install under DIR instead of / (an image, a package); reloads nothing",
    )
    p.set_defaults(func=_cmd_setup)

    p = sub.add_parser(
        "doctor",
        help="what this machine gives gpulaunch and what it lacks, each with its fix",
        description="Check this machine for gpulaunch: the supervisor a job would get, "
        "systemd, user jobs, the job API's bus policy, journald's rate limit, cgroup "
        "controllers, open-file limits and NVIDIA GPUs. Exit status 69 when a job cannot run.",
    )
    p.add_argument("--json", action="store_true", help="print the findings as JSON")
    add_manager_options(p, "check for jobs")
    p.set_defaults(func=_cmd_doctor)

    p = sub.add_parser("stacks", help="every running rank's Python stacks, all threads (py-spy)")
    p.add_argument("job", metavar="JOB")
    p.add_argument("--rank", type=_rank_number, metavar="N", help="only this rank")
    p.add_argument("--native", action="store_true", help="C/C++ frames too (py-spy --native)")
    add_manager_options(p)
    p.set_defaults(func=_cmd_stacks)


# Each subcommand's function, imported only when it runs (each loads what it needs). Real
# imports, not names in strings, so that the layer contract (`lint-imports`) sees them.


def _cmd_list(args: argparse.Namespace) -> int:
    from gpulaunch.jobapi.commands import cmd_list

    return cmd_list(args)


def _cmd_status(args: argparse.Namespace) -> int:
    from gpulaunch.jobapi.commands import cmd_status

    return cmd_status(args)


def _cmd_top(args: argparse.Namespace) -> int:
    from gpulaunch.jobapi.top import cmd_top

    return cmd_top(args)


def _cmd_stop(args: argparse.Namespace) -> int:
    from gpulaunch.jobapi.commands import cmd_stop

    return cmd_stop(args)


def _cmd_wait(args: argparse.Namespace) -> int:
    from gpulaunch.jobapi.commands import cmd_wait

    return cmd_wait(args)


def _cmd_signal(args: argparse.Namespace) -> int:
    from gpulaunch.jobapi.commands import cmd_signal

    return cmd_signal(args)


def _cmd_logs(args: argparse.Namespace) -> int:
    from gpulaunch.logs.command import cmd_logs

    return cmd_logs(args)


def _cmd_setup(args: argparse.Namespace) -> int:
    from gpulaunch.system.setup import cmd_setup

    return cmd_setup(args)


def _cmd_doctor(args: argparse.Namespace) -> int:
    from gpulaunch.system.doctor import cmd_doctor

    return cmd_doctor(args)


def _cmd_stacks(args: argparse.Namespace) -> int:
    from gpulaunch.debug.command import cmd_stacks

    return cmd_stacks(args)


def build_parser() -> argparse.ArgumentParser:
    """Every subcommand of `gpulaunch`, defined here and nowhere else."""
    parser = _Parser(
        prog="gpulaunch", description="Distributed PyTorch ranks supervised by systemd."
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks of errors")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    start = sub.add_parser(
        "start",
        help="run a job: one rank per process, each a systemd scope",
        epilog=_start_exit_codes(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_start_options(start)
    add_torchrun_options(start)
    add_output_options(start)
    start.add_argument(
        "--detach", "-d", action="store_true", help="print the job id and return; the job runs on"
    )
    add_hang_options(start)
    add_metrics_options(start)
    # Set by the front end (gpulaunch/frontend/) on the watcher it starts; not for users.
    start.add_argument("--frontend-child", action="store_true", help=argparse.SUPPRESS)
    start.set_defaults(func=cmd_start)
    render = sub.add_parser("render", help="print the units that `start` would create")
    add_start_options(render)
    add_torchrun_options(render)
    render.set_defaults(func=cmd_render)
    _add_job_commands(sub)
    parser.add_argument("--version", action="version", version=f"gpulaunch {__version__}")
    _add_system_commands(sub)
    return parser


def cmd_render(args: argparse.Namespace) -> int:
    from gpulaunch.start import render

    return render(start_options(args), args.argv)


def cmd_start(args: argparse.Namespace) -> int:
    from gpulaunch.start import start

    hang = HangOptions(hang_timeout=args.hang_timeout, dump_stacks=args.dump_stacks)
    return start(
        start_options(args),
        output_options(args),
        detach=args.detach,
        argv=args.argv,
        frontend_child=args.frontend_child,
        hang_options=hang,
        metrics=metrics_options(args),
    )


# The script and its arguments may be any bytes (gpulaunch/base/argtext.py); `argv` is ours.
_ANY_BYTES = frozenset({"script", "args", "argv"})


def _check_text(args: argparse.Namespace) -> None:
    """Every other value on the command line must be UTF-8: it goes to D-Bus, the journal."""
    for dest, value in vars(args).items():
        values = value if isinstance(value, list) else [value]
        for one in values:
            if dest not in _ANY_BYTES and isinstance(one, (str, Path)) and not_utf8(str(one)):
                what = "job id" if dest == "job" else f"value of {dest.replace('_', '-')}"
                raise UsageError(
                    f"the {what} is not valid UTF-8: {printable(str(one))}",
                    "only the script and its arguments may be other bytes",
                )


def _one_line(text: str) -> str:
    """An error stays one line whatever the user typed: control characters as escapes."""
    text = printable(text)
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _stdout_gone() -> bool:
    """Whether stdout is a pipe (or socket) whose reader has gone: then, and only then, a
    BrokenPipeError is the reader's doing (POLLERR on the write end of a readerless pipe)."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, ValueError, OSError):
        return False
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    return any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))


def _internal_error(exc: BaseException, debug: bool) -> int:
    """A bug: say so in one line, traceback with --debug."""
    if debug:
        traceback.print_exception(exc)
    print(
        f"gpulaunch: internal error: {type(exc).__name__}: {exc}; rerun with --debug and report it",
        file=sys.stderr,
    )
    return INTERNAL_ERROR


def _termination_message(args: argparse.Namespace, line: str, code: int) -> None:
    """A start that ended in an error before any report: Kubernetes shows the line too."""
    from gpulaunch.schedulers.termination import termination_path, write_message

    path = termination_path(getattr(args, "termination_log", None), os.environ)
    if path is not None:
        write_message(
            path, f"{line.removeprefix('gpulaunch: ')}\ncause: start-failed; status {code}\n"
        )


def main(argv: Sequence[str] | None = None) -> NoReturn:
    parser = build_parser()
    debug = False  # a bad command line is never worth a traceback
    args: argparse.Namespace | None = None
    try:
        argv = unpack_argv(sys.argv[1:] if argv is None else argv)
        forgot_start(list(argv), parser)  # `gpulaunch --nproc-per-node 2 train.py`: start's
        args = parser.parse_args(argv)
        debug = bool(args.debug)
        _check_text(args)
        args.argv = list(argv)
        if "manager" in args:  # --system/--user, or the default for who runs it
            args.manager = default_manager(args.manager)
        if getattr(args, "user_of", None) is not None:  # root, about a user's jobs
            from gpulaunch.jobapi import whose
            from gpulaunch.model import Manager

            whose.act_for(whose.resolve(args.user_of))
            args.manager = Manager.USER
        code = int(args.func(args))
    except KeyboardInterrupt:  # Ctrl-C outside the watcher's loop: quietly, the shell's 130
        code = 130
    except BrokenPipeError as exc:
        if _stdout_gone():  # `gpulaunch doctor | head`: the reader is gone, as SIGPIPE
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            code = 128 + 13
        else:  # a pipe of ours, not stdout: never a silent 141 (issue 22, item 1)
            code = _internal_error(exc, debug)
    except GpulaunchError as exc:
        if debug:
            traceback.print_exc()
        hint = f"; {exc.hint}" if exc.hint else ""
        line = _one_line(f"gpulaunch: error: {exc.message}{hint}")
        print(line, file=sys.stderr)
        code = exc.exit_code
        if args is not None and getattr(args, "func", None) is cmd_start:
            _termination_message(args, line, code)
    except Exception as exc:  # a bug: say so in one line, traceback with --debug
        code = _internal_error(exc, debug)
    sys.stdout.flush()
    sys.exit(code)
