"""The options of `gpulaunch start` and `render` (torchrun's flags among them), and --system/--user.

cli.py defines every subcommand and uses these to build `start` and `render`;
`start_options` turns their parsed values into `StartOptions` (gpulaunch/plan/spec.py).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from pathlib import Path

from gpulaunch.errors import UsageError
from gpulaunch.logs.output import LOG_DIR_HINT, OutputOptions, log_dir_problem, parse_ranks
from gpulaunch.model import Manager, SupervisorKind
from gpulaunch.numberlist import parse_number_list
from gpulaunch.plan.bounds import (
    MAX_NNODES,
    MAX_NODE_TIMEOUT,
    MAX_NPROC,
    MAX_RESTARTS,
    MIN_NODE_TIMEOUT,
)
from gpulaunch.plan.gpus import parse_gpu_list
from gpulaunch.plan.leaserequest import LeaseRequest, parse_request
from gpulaunch.plan.nodes import NodeOptions
from gpulaunch.plan.placement import Resources
from gpulaunch.plan.spec import Launch, StartOptions
from gpulaunch.plan.topology import CpuBind
from gpulaunch.progress.options import add_straggler_options, straggler_rule
from gpulaunch.recovery.options import add_recovery_options, recovery_options
from gpulaunch.schedulers.options import add_scheduler_options, scheduler_options
from gpulaunch.units.templates import units_dir_problem
from gpulaunch.warm.fit import modules_option


def add_manager_options(
    p: argparse.ArgumentParser, what: str = "jobs", user_of: bool = False
) -> None:
    """`--system` / `--user`: which systemd manager (and bus) the command is about.

    `user_of`: also `--user-of USER`, root's way to an ordinary user's jobs (jobapi/whose.py).
    """
    group = p.add_mutually_exclusive_group()
    group.add_argument(
        "--system",
        dest="manager",
        action="store_const",
        const=Manager.SYSTEM,
        help=f"{what} of the system manager (system bus; default as root)",
    )
    group.add_argument(
        "--user",
        dest="manager",
        action="store_const",
        const=Manager.USER,
        help=f"{what} of your user manager (session bus; default for other users)",
    )
    if user_of:
        group.add_argument(
            "--user-of",
            metavar="USER",
            help=f"root: {what} of USER's user manager (their session bus and records), "
            "as systemctl --user -M USER@",
        )


def default_manager(asked: Manager | None) -> Manager:
    """The manager asked for, else root's system manager or a user's own."""
    if asked is not None:
        return Manager(asked)
    return Manager.SYSTEM if os.geteuid() == 0 else Manager.USER


def _seconds(text: str) -> float:
    """A number; plan/spec.py's check_grace says which are too small, too big or not finite."""
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None


def _node_timeout(text: str) -> float:
    seconds = _seconds(text)
    if not MIN_NODE_TIMEOUT <= seconds <= MAX_NODE_TIMEOUT:
        raise argparse.ArgumentTypeError(
            f"must be between {MIN_NODE_TIMEOUT:g} and {MAX_NODE_TIMEOUT:g} seconds, not {text}"
        )
    return seconds


def _nproc(text: str) -> int | str:
    if text in ("gpu", "cpu", "auto"):
        return text
    try:
        number = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number, gpu, cpu or auto: {text!r}") from None
    if not 1 <= number <= MAX_NPROC:  # refused before anything is planned (plan/bounds.py)
        raise argparse.ArgumentTypeError(f"must be between 1 and {MAX_NPROC}, not {text}")
    return number


def _count(least: int, most: int) -> Callable[[str], int]:
    """An argparse type: a whole number from `least` to `most`."""

    def count(text: str) -> int:
        try:
            number = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
        if not least <= number <= most:
            raise argparse.ArgumentTypeError(f"must be between {least} and {most}, not {text}")
        return number

    return count


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
    "job; SIGUSR1 and SIGUSR2 are passed on to the ranks (--signal-whole-rank: to all their "
    "processes)",
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


def add_torchrun_options(p: argparse.ArgumentParser) -> None:
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
        type=_count(0, MAX_RESTARTS),
        default=0,
        metavar="N",
        help="restart all ranks up to N times after a failure (default: 0)",
    )
    _add_warm_options(p)
    add_recovery_options(p)
    _add_node_options(p)
    add_straggler_options(p)
    add_scheduler_options(p)
    for flags in TORCHRUN_ONLY:
        p.add_argument(*flags, action=_Refuse, nargs="?", help=argparse.SUPPRESS)


def _add_warm_options(p: argparse.ArgumentParser) -> None:
    """--preload, --no-preload: warm ranks (gpulaunch/warm/, README's "Warm ranks")."""
    p.add_argument(
        "--preload",
        type=_preload_modules,
        default=None,
        metavar="MODULE,...",
        help="start ranks warm: fork each from a process that imported torch, "
        "torch.distributed and MODULE,... (e.g. --preload torch); off by default",
    )
    p.add_argument(
        "--no-preload",
        dest="preload",
        action="store_const",
        const=None,
        help="start every rank as a new interpreter (the default)",
    )


def _preload_modules(value: str) -> tuple[str, ...]:
    try:
        return modules_option(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _add_node_options(p: argparse.ArgumentParser) -> None:
    """torchrun's multi-node flags (docs/multinode.md); under srun, SLURM's variables."""
    g = p.add_argument_group("multi-node (one gpulaunch per node; see docs/multinode.md)")
    g.add_argument(
        "--nnodes",
        metavar="N|MIN:MAX",
        help="nodes in the job (default: 1, or SLURM's); MIN:MAX with c10d: elastic",
    )
    g.add_argument(
        "--node-rank",
        "--node_rank",
        type=_count(0, MAX_NNODES - 1),
        metavar="R",
        help="this node's rank, static rendezvous (default: 0, or SLURM_NODEID)",
    )
    g.add_argument(
        "--rdzv-backend",
        "--rdzv_backend",
        metavar="NAME",
        help="static (default: --master-addr/--master-port), c10d (torch's, --rdzv-endpoint) "
        "or gpulaunch (gpulaunch's own on torch's store: a lost node is out within "
        "--node-timeout; docs/multinode.md)",
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
        "--node-timeout",
        type=_node_timeout,
        metavar="S",
        help="a node silent this long is lost (default: 2 with --rdzv-backend gpulaunch, "
        "else 6; 0.5 to 600)",
    )
    g.add_argument(
        "--local-addr",
        "--local_addr",
        metavar="ADDR",
        help="this node's address as the other nodes reach it (default: its FQDN)",
    )


def add_start_options(p: argparse.ArgumentParser) -> None:
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
        type=_seconds,
        default=10.0,
        metavar="SECONDS",
        help="time between SIGTERM and SIGKILL when ranks are stopped (default: 10)",
    )
    p.add_argument("--memory-max", metavar="BYTES", help="memory limit of each rank (MemoryMax=)")
    p.add_argument(
        "--job-memory-max",
        metavar="BYTES",
        help="memory limit of the whole job, all ranks and the watcher together (MemoryMax= of "
        "the job slice)",
    )
    _add_placement_options(p)
    p.add_argument(
        "--units-dir",
        action="append",
        type=_units_dir,
        default=[],
        metavar="DIR",
        help="look for unit templates here first (repeatable)",
    )
    add_manager_options(p, "the job's units")
    p.add_argument(
        "--supervisor",
        choices=[kind.value for kind in SupervisorKind],
        default=SupervisorKind.AUTO.value,
        help="who contains and stops the ranks: systemd (scopes and slices), direct (the "
        "watcher: its own cgroups, else process groups) or auto (default: direct in a Slurm "
        "step or where no systemd manager answers; see docs/environments.md)",
    )
    p.add_argument(
        "--signal-whole-rank",
        action="store_true",
        help="pass SIGUSR1/SIGUSR2 on to every process of each rank, not only its main one",
    )
    p.add_argument(
        "--stdin-rank",
        type=_stdin_rank,
        default=0,
        metavar="N|none",
        help="the rank that reads gpulaunch's stdin, e.g. the terminal for input() or pdb "
        "(default: 0); the others read /dev/null",
    )
    p.add_argument("script", help="the training script (run with this Python)")
    p.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the script")


def _stdin_rank(text: str) -> int | None:
    if text == "none":
        return None
    if not text.isdigit() or int(text) >= 1 << 31:
        raise argparse.ArgumentTypeError(f"{text!r} is not a rank: give a number, or none")
    return int(text)


def _gpu_list(text: str) -> tuple[int, ...] | LeaseRequest:
    try:
        return parse_request(text) or parse_gpu_list(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{exc}; use e.g. 0,2,3 or 0-3 or auto:2") from None


def _add_placement_options(p: argparse.ArgumentParser) -> None:
    """GPUs and CPUs per rank (gpulaunch/plan/placement.py)."""
    p.add_argument(
        "--cpus-per-rank",
        type=_count(1, 1 << 20),
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
        help="the GPUs to use, e.g. 0,2,3, counted in CUDA_VISIBLE_DEVICES; one rank each; "
        "auto:N: N GPUs no other gpulaunch job on this machine holds (a lease, refused at once "
        "naming the holders if there are too few)",
    )
    p.add_argument(
        "--wait-for-gpus",
        action="store_true",
        help="with --gpus auto:N: wait until N GPUs are free instead of being refused",
    )
    p.add_argument(
        "--allow-busy-gpus",
        action="store_true",
        help="start even where another process holds memory on a GPU of the job (the health "
        "gate refuses that by default; lost GPUs, ECC errors, pending retired pages and XIDs "
        "are refused still)",
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
        parse_number_list(text, "rank", skip_empty=True, most=MAX_NPROC - 1)  # not 0-99999999
        return parse_ranks(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{exc}; use e.g. 0 or 0,3 or 0-3") from None


def _log_dir(text: str) -> Path:
    try:
        problem = log_dir_problem(Path(text))
    except OSError as exc:  # a name too long (ENAMETOOLONG), a loop of links, ...
        problem = f"{text}: {exc.strerror}"
    if problem:
        raise argparse.ArgumentTypeError(f"{problem}; {LOG_DIR_HINT}")
    return Path(text)


def _units_dir(text: str) -> Path:
    problem = units_dir_problem(Path(text))
    if problem:
        raise argparse.ArgumentTypeError(f"{problem}; give a directory of unit templates")
    return Path(text)


def add_output_options(p: argparse.ArgumentParser) -> None:
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
        type=_log_dir,
        metavar="DIR",
        help="also write each rank's output to DIR/rankN.log, stdout and stderr as they came "
        "(not torchrun's DIR/<run id>/attempt_<n>/<rank>/{stdout,stderr}.log)",
    )


def start_options(args: argparse.Namespace) -> StartOptions:
    if args.standalone and args.nnodes not in (None, "1", "1:1"):  # torchrun's: one node
        raise UsageError(
            f"--standalone is one node: it cannot be --nnodes {args.nnodes}",
            "drop --standalone for a multi-node job, or --nnodes for a single-node one",
        )
    if args.wait_for_gpus and not isinstance(args.gpus, LeaseRequest):
        raise UsageError(
            "--wait-for-gpus waits for a lease: it needs --gpus auto:N",
            "add --gpus auto:N (N GPUs no other job holds), or drop --wait-for-gpus",
        )
    return StartOptions(
        script=args.script,
        args=tuple(args.args),
        nproc=args.nproc if args.nproc is not None else _default_nproc(args.gpus),
        job=args.job,
        master_addr=args.master_addr,
        master_port=args.master_port,
        grace_sec=args.grace,
        manager=default_manager(args.manager),
        memory_max=args.memory_max,
        job_memory_max=args.job_memory_max,
        units_dirs=tuple(args.units_dir),
        resources=Resources(
            gpus=None if isinstance(args.gpus, LeaseRequest) else args.gpus,
            gpu_isolation=args.gpu_isolation,
            cpus_per_rank=args.cpus_per_rank,
            cpu_bind=CpuBind(args.cpu_bind),
        ),
        machine_root=args.machine_root,
        launch=args.launch or Launch.SCRIPT,
        max_restarts=args.max_restarts,
        preload=args.preload,
        nodes=NodeOptions(
            nnodes=args.nnodes,
            node_rank=args.node_rank,
            rdzv_backend=args.rdzv_backend,
            rdzv_endpoint=args.rdzv_endpoint,
            rdzv_id=args.rdzv_id,
            rdzv_conf=args.rdzv_conf,
            local_addr=args.local_addr,
            node_timeout=args.node_timeout,
        ),
        signal_whole_rank=args.signal_whole_rank,
        stdin_rank=args.stdin_rank,
        supervisor=SupervisorKind(args.supervisor),
        gpu_lease=args.gpus if isinstance(args.gpus, LeaseRequest) else None,
        wait_for_gpus=args.wait_for_gpus,
        allow_busy_gpus=args.allow_busy_gpus,
        recovery=recovery_options(args),
        stragglers=straggler_rule(args),
        schedulers=scheduler_options(args),
    )


def _default_nproc(gpus: tuple[int, ...] | LeaseRequest | None) -> int:
    """One rank per GPU of --gpus (a list or auto:N), else one."""
    if isinstance(gpus, LeaseRequest):
        return gpus.count
    return len(gpus) if gpus else 1


def output_options(args: argparse.Namespace) -> OutputOptions:
    return OutputOptions(ranks=args.ranks, quiet=args.quiet, log_dir=args.log_dir)


def forgot_start(argv: list[str], parser: argparse.ArgumentParser) -> None:
    """torchrun's habit with no command: `gpulaunch --nproc-per-node 2 train.py`, `gpulaunch
    train.py`. One line that says what was meant (UsageError), before argparse's "invalid
    choice" for a word that is not the command at all."""
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    first = next((a for a in argv if a not in parser._option_string_actions), None)
    if first is None or first in sub.choices:
        return
    start = sub.choices["start"]
    launcher = first.split("=", 1)[0] in start._option_string_actions
    if launcher or (not first.startswith("-") and first.endswith(".py")):
        import shlex

        words = shlex.join(a for a in argv if a != "--debug")
        raise UsageError(f"{first!r} is not a command; did you mean `gpulaunch start {words}`?")
