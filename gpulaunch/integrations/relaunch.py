"""The process a user started becomes gpulaunch's watcher for the same command line.

A framework strategy (gpulaunch/integrations/lightning.py) asks two questions
here, both pure (no torch, no `os.environ` but what the caller passes):

- `role()`: is this the process the user started (it becomes the watcher), or a
  rank someone already made (gpulaunch, torchrun, or srun one task per rank),
  which then runs as the framework's own DDP?
- `watcher_argv()`: the `gpulaunch start` command line that runs the exact
  command the user typed (interpreter, its options, `-m`/`-c`/script, arguments)
  once per rank, in the same working directory.

`become_watcher()` then `exec`s it: the pid stays the one the user started, so
every rank, rank 0 included, is that process's child, in its own scope.
"""

from __future__ import annotations

import enum
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn


class RelaunchError(ValueError):
    """The script cannot be run again once per rank as started (a ValueError, as the
    framework's other configuration errors are)."""


class Role(enum.StrEnum):
    """What the strategy does in this process."""

    WATCHER = "watcher"  # the process the user started: exec gpulaunch's watcher
    RANK = "rank"  # a rank made by a launcher (gpulaunch, torchrun, srun): the framework's DDP


@dataclass(frozen=True)
class WatcherOptions:
    """`gpulaunch start` options a strategy passes on (None: gpulaunch's default)."""

    grace: float | None = None  # --grace: seconds between SIGTERM and SIGKILL
    memory_max: str | None = None  # --memory-max: each rank's MemoryMax=
    job_memory_max: str | None = None  # --job-memory-max: the whole job's
    log_dir: str | None = None  # --log-dir: DIR/rankN.log too
    hang_timeout: float | None = None  # --hang-timeout: stop a job silent for that long
    job: str | None = None  # --job: the job id (default: the script's name + 6 hex)
    max_restarts: int | None = None  # --max-restarts
    supervisor: str | None = None  # --supervisor: systemd, direct or auto
    extra_args: tuple[str, ...] = ()  # any other `gpulaunch start` options, as typed

    def args(self) -> list[str]:
        out: list[str] = []
        for flag, value in (
            ("--grace", self.grace),
            ("--memory-max", self.memory_max),
            ("--job-memory-max", self.job_memory_max),
            ("--log-dir", self.log_dir),
            ("--hang-timeout", self.hang_timeout),
            ("--max-restarts", self.max_restarts),
            ("--supervisor", self.supervisor),
        ):
            if value is not None:
                out += [flag, f"{value:g}" if isinstance(value, float) else str(value)]
        return out + list(self.extra_args)


def _int(env: Mapping[str, str], *names: str) -> int | None:
    for name in names:
        value = env.get(name, "").strip()
        if value.isdigit():
            return int(value)
    return None


def role(
    env: Mapping[str, str],
    *,
    externally: bool,
    slurm: bool,
    num_processes: int,
    num_nodes: int,
) -> Role:
    """Whether this process becomes the watcher or is already one of the ranks.

    `externally`: the framework's cluster environment says someone else creates the
    processes (torchrun, srun, a rank of a launcher: `LOCAL_RANK` set). `slurm`: that
    environment is SLURM's (srun started this process). Under srun, one task per node
    means gpulaunch starts the node's ranks (as `srun --ntasks-per-node=1 gpulaunch
    start`); one task per device means srun started every rank itself.
    """
    if "GPULAUNCH_JOB" in env and "LOCAL_RANK" in env:
        return Role.RANK
    if slurm:
        tasks = _int(env, "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS")
        nodes = _int(env, "SLURM_STEP_NUM_NODES", "SLURM_NNODES", "SLURM_JOB_NUM_NODES") or 1
        if tasks is None or tasks == nodes:
            return Role.WATCHER
        if tasks == nodes * num_processes:
            return Role.RANK
        raise RelaunchError(
            f"srun started {tasks} tasks on {nodes} node(s), but strategy='gpulaunch' with "
            f"devices={num_processes} needs one task per node (gpulaunch starts the ranks) "
            f"or {num_processes} per node (srun starts every rank); "
            "use srun --ntasks-per-node=1"
        )
    return Role.RANK if externally else Role.WATCHER


def rank_command(python: str, orig_argv: Sequence[str]) -> list[str]:
    """The command each rank runs: the one the user typed (`sys.orig_argv`: interpreter
    options, `-m MODULE`, `-c CODE` or the script, and its arguments), with this
    interpreter and `-u` so that the live view gets lines as they are written."""
    target = _target(orig_argv)
    if target in ("", "-"):
        raise RelaunchError(
            "strategy='gpulaunch' runs the script again once per rank, and this Python reads "
            "its program from a terminal or stdin; start it as `python SCRIPT`, "
            "`python -m MODULE` or `python -c CODE`"
        )
    return [python, "-u", *orig_argv[1:]]


def _target(orig_argv: Sequence[str]) -> str:
    """What the interpreter runs: a script path, `-m`, `-c`, `-` or "" (interactive)."""
    args = list(orig_argv[1:])
    takes_value = {"-W", "-X", "--check-hash-based-pycs"}
    i = 0
    while i < len(args):
        arg = args[i]
        if arg in ("-m", "-c") or arg.startswith(("-m", "-c")) and not arg.startswith("--"):
            return arg[:2]
        if arg == "-" or not arg.startswith("-"):
            return arg
        if arg == "-i":
            return ""
        i += 2 if arg in takes_value else 1
    return ""


def job_label(argv0: str, main_module: str | None) -> str:
    """The readable part of the default job id: the module's or script's name."""
    if main_module:
        name = main_module.removesuffix(".__main__")
        return name.rsplit(".", 1)[-1]
    if argv0 in ("-c", "-", ""):
        return "python"
    return Path(argv0).stem


def node_args(env: Mapping[str, str], *, slurm: bool, num_nodes: int) -> list[str]:
    """Where this node is among `num_nodes`, as `gpulaunch start` options.

    Under srun gpulaunch reads SLURM's variables itself. Elsewhere, as with Lightning's
    own launcher, every node is started with NODE_RANK and MASTER_ADDR (MASTER_PORT
    optional); on one node MASTER_ADDR/MASTER_PORT are honoured when set.
    """
    out: list[str] = []
    if num_nodes > 1:
        out += ["--nnodes", str(num_nodes)]
        if slurm:
            return out
        node_rank = env.get("NODE_RANK", env.get("GROUP_RANK"))
        if node_rank is None or "MASTER_ADDR" not in env:
            raise RelaunchError(
                f"num_nodes={num_nodes} outside srun needs NODE_RANK and MASTER_ADDR (and "
                "MASTER_PORT) set on every node, as Lightning's own launcher does; or start "
                "one task per node with srun"
            )
        out += ["--node-rank", node_rank]
    if "MASTER_ADDR" in env:
        out += ["--master-addr", env["MASTER_ADDR"]]
    if "MASTER_PORT" in env:
        out += ["--master-port", env["MASTER_PORT"]]
    return out


def watcher_argv(
    python: str,
    *,
    nproc: int,
    nodes: Sequence[str],
    options: WatcherOptions,
    command: Sequence[str],
    job: str | None,
) -> list[str]:
    """`python -m gpulaunch start ... --no-python COMMAND`: the watcher for `command`."""
    argv = [python, "-m", "gpulaunch", "start", "--nproc", str(nproc)]
    if job is not None:
        argv += ["--job", job]
    return [*argv, *nodes, *options.args(), "--no-python", *command]


def become_watcher(argv: Sequence[str]) -> NoReturn:
    """Replace this process by the watcher: same pid, cwd, environment and terminal."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # closed or gone: nothing of ours to lose
            pass
    os.execv(argv[0], list(argv))
