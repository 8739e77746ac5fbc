"""From command-line options to a `JobSpec` and the units it will create.

Everything a job needs is decided here, before anything starts: a bad option,
a missing script or a bad template fails here and leaves nothing behind.
"""

from __future__ import annotations

import enum
import errno
import importlib.util
import os
import re
import secrets
import shutil
import socket
import stat
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from gpulaunch.base.names import UnitNames, validate_job_id
from gpulaunch.base.protocol import Layout, NodeConfig
from gpulaunch.errors import UsageError
from gpulaunch.model import JobSpec, Manager, RankSpec, StragglerRule, SupervisorKind
from gpulaunch.plan.environment import RankPlace, rank_environment
from gpulaunch.plan.gpus import visible_pool
from gpulaunch.plan.leaserequest import LeaseRequest
from gpulaunch.plan.nodes import NodeOptions, NodePlan, plan_nodes
from gpulaunch.plan.placement import (
    Machine,
    Placement,
    Resources,
    check_memory_max,
    place_ranks,
)
from gpulaunch.recovery.settings import RecoveryOptions
from gpulaunch.schedulers.options import SchedulerOptions, check_scheduler_options
from gpulaunch.schedulers.termination import termination_path


class Launch(enum.StrEnum):
    """How a rank runs its target (torchrun's -m, --no-python, --run-path)."""

    SCRIPT = "script"  # python -u SCRIPT ARGS
    MODULE = "module"  # python -u -m MODULE ARGS
    NO_PYTHON = "no-python"  # PROGRAM ARGS, found on PATH
    RUN_PATH = "run-path"  # SCRIPT through runpy.run_path, as torchrun --run-path does

    def argv(self, target: str, args: Sequence[str]) -> tuple[str, ...]:
        if self is Launch.MODULE:
            return (sys.executable, "-u", "-m", target, *args)
        if self is Launch.NO_PYTHON:
            return (target, *args)
        if self is Launch.RUN_PATH:
            return (sys.executable, "-u", "-c", _RUN_PATH, target, *args)
        return (sys.executable, "-u", target, *args)


_RUN_PATH = (
    "import runpy, sys; sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')"
)


@dataclass(frozen=True)
class StartOptions:
    """What the user asked for on the command line (parsed, not yet checked)."""

    script: str
    args: tuple[str, ...]
    nproc: int | str  # a number, or "gpu", "cpu", "auto" (torchrun's --nproc-per-node)
    job: str | None
    master_addr: str | None  # None: not given (127.0.0.1, or what SLURM says)
    master_port: int | None
    grace_sec: float
    manager: Manager
    memory_max: str | None = None
    job_memory_max: str | None = None
    units_dirs: tuple[Path, ...] = ()
    # --gpus, --gpu-isolation, --cpus-per-rank, --cpu-bind (gpulaunch/plan/placement.py)
    resources: Resources = Resources()
    machine_root: Path | None = None  # test stand-in: a fake /proc and /sys (--machine-root)
    launch: Launch = Launch.SCRIPT
    max_restarts: int = 0
    preload: tuple[str, ...] | None = None  # --preload: warm ranks (gpulaunch/warm/); None: cold
    nodes: NodeOptions = NodeOptions()  # --nnodes, --node-rank, --rdzv-*, --local-addr
    signal_whole_rank: bool = False  # --signal-whole-rank
    stdin_rank: int | None = 0  # --stdin-rank (None: none)
    supervisor: SupervisorKind = SupervisorKind.AUTO  # --supervisor (supervisor/choose.py)
    # --gpus auto:N, --wait-for-gpus: leased before the plan (gpulaunch/leases/)
    gpu_lease: LeaseRequest | None = None
    wait_for_gpus: bool = False
    allow_busy_gpus: bool = False  # the health gate lets a GPU with others' memory pass
    recovery: RecoveryOptions = RecoveryOptions()  # restarts by class, preemption (recovery/)
    stragglers: StragglerRule = StragglerRule()  # --straggler-factor, --straggler-steps
    # --termination-log, --gpu-job-map: what the cluster's tools read (gpulaunch/schedulers/)
    schedulers: SchedulerOptions = SchedulerOptions()


def job_stem(script: str) -> str:
    """The readable part of a default job id: the script's name, safe for unit names."""
    stem = re.sub(r"[^A-Za-z0-9_]+", "_", Path(script).stem).strip("_") or "job"
    return stem[:40]


def generated_job_id(script: str) -> str:
    """`<script stem>_<6 hex>`: readable, unique, and needing no escaping."""
    return f"{job_stem(script)}_{secrets.token_hex(3)}"


# seconds (31 years): any longer is "never", and systemd counts in 64-bit µs. A stop that
# never escalates to SIGKILL would leave ranks behind (units/guarantees.py).
GRACE_MAX = 1e9


def check_grace(seconds: float) -> None:
    """--grace is a finite number of seconds that systemd can hold (TimeoutStopSec=)."""
    if not 0 <= seconds <= GRACE_MAX:  # also NaN
        raise UsageError(
            f"--grace must be between 0 and {GRACE_MAX:.0f} seconds, not {seconds:g}",
            "give the seconds between SIGTERM and SIGKILL, e.g. --grace 10",
        )


def free_port(addr: str) -> int:
    """A TCP port that is free on `addr` now (as torchrun --standalone picks one)."""
    with socket.socket(socket.AF_INET6 if ":" in addr else socket.AF_INET) as sock:
        try:
            sock.bind((addr, 0))
        except OSError as exc:
            raise UsageError(
                f"cannot bind to --master-addr {addr}: {exc.strerror}",
                "use an address of this machine, e.g. 127.0.0.1",
            ) from exc
        port: int = sock.getsockname()[1]
        return port


@dataclass(frozen=True)
class JobDraft:
    """A job checked and placed on this machine, its ranks not yet numbered (`number_ranks`).

    A multi-node job is drafted once; the rendezvous's `Layout` only numbers its ranks.
    """

    opts: StartOptions
    base_env: Mapping[str, str]
    cwd: str
    job: str
    names: UnitNames
    nproc: int
    places: tuple[Placement, ...]
    nodes: NodePlan
    node_config: NodeConfig | None


def make_spec(
    opts: StartOptions,
    base_env: Mapping[str, str],
    cwd: str,
    machine: Machine | None = None,
    layout: Layout | None = None,
) -> JobSpec:
    """Check the options and plan every rank (`draft_job`, then `number_ranks`)."""
    return number_ranks(draft_job(opts, base_env, cwd, machine), layout)


def draft_job(
    opts: StartOptions, base_env: Mapping[str, str], cwd: str, machine: Machine | None = None
) -> JobDraft:
    """Check the options and place the ranks on this machine (bad input fails here).

    `machine` says what GPUs and CPUs there are (default: this machine, or the fake one
    under `opts.machine_root`); it is read only when a placement option needs it.
    """
    if opts.max_restarts < 0:
        raise UsageError(f"--max-restarts must not be negative, not {opts.max_restarts}")
    check_grace(opts.grace_sec)
    check_scheduler_options(opts.schedulers)
    if opts.master_port is not None and not 0 < opts.master_port < 65536:
        raise UsageError(f"--master-port must be between 1 and 65535, not {opts.master_port}")
    check_target(opts.launch, opts.script, cwd, base_env)
    nodes = plan_nodes(
        opts.nodes,
        opts.master_addr,
        opts.master_port,
        opts.max_restarts,
        job_stem(opts.script),
        base_env,
    )
    if opts.recovery.requeue.max_requeues is not None and nodes.config is not None:
        raise UsageError(
            "--max-requeues is for a job on one node (its ranks' restarts are this "
            "node's alone); several nodes restart together (--max-restarts)",
            "leave --max-requeues out, and requeue on 79 (a preemption) only",
        )
    job = opts.job if opts.job is not None else nodes.default_job or generated_job_id(opts.script)
    problem = validate_job_id(job)
    if problem:
        raise UsageError(f"invalid --job {job!r}: {problem}")
    names = UnitNames.for_job(job)
    if opts.memory_max is not None:
        check_memory_max(opts.memory_max)
    if opts.job_memory_max is not None:
        check_memory_max(opts.job_memory_max, "--job-memory-max")
    if machine is None:
        machine = Machine.fake(opts.machine_root) if opts.machine_root else Machine.this()
    nproc = resolve_nproc(opts.nproc, opts.resources, base_env, machine)
    places = place_ranks(opts.resources, nproc, base_env, machine)
    node_config = nodes.for_job(job, nproc)
    if node_config is None and opts.stdin_rank is not None and opts.stdin_rank >= nproc:
        raise UsageError(
            f"--stdin-rank {opts.stdin_rank}: the job's ranks are 0 to {nproc - 1}",
            "give one of them, or --stdin-rank none",
        )
    if node_config is not None and importlib.util.find_spec("torch") is None:
        raise UsageError(
            f"a job of several nodes needs torch in gpulaunch's Python ({sys.executable}): "
            "the nodes meet through torch's rendezvous",
            "pip install 'gpulaunch[torch]' (or torch) into that environment",
        )
    return JobDraft(opts, base_env, cwd, job, names, nproc, places, nodes, node_config)


def number_ranks(draft: JobDraft, layout: Layout | None = None) -> JobSpec:
    """The job's spec: its ranks numbered, each with its environment.

    `layout`: where the rendezvous put this node in a multi-node job; without it, a
    multi-node job's ranks are numbered as if this were node 0 (to check the options).
    """
    opts, base_env, cwd, job, names = draft.opts, draft.base_env, draft.cwd, draft.job, draft.names
    nproc, places, nodes, node_config = draft.nproc, draft.places, draft.nodes, draft.node_config
    if node_config is None:
        layout = None
        addr = nodes.master_addr
        port = nodes.master_port if nodes.master_port is not None else free_port(addr)
        first, world, node_rank, nnodes, agent_store = 0, nproc, 0, 1, False
    else:
        if layout is None:  # before the rendezvous: only to check the options
            addr, port, agent_store = nodes.master_addr, 0, True
            first, world, node_rank, nnodes = 0, nproc, 0, node_config.nnodes
        else:
            addr, port, agent_store = layout.master_addr, layout.master_port, layout.use_agent_store
            first, world, node_rank = layout.first_rank, layout.world_size, layout.node_rank
            nnodes = layout.nnodes  # --nnodes MIN:MAX: as many as the rendezvous settled
    argv = opts.launch.argv(opts.script, opts.args)
    told: dict[str, str] = {}  # each round's membership (gpulaunch/multinode/roster.py)
    if layout is not None and layout.membership_file:
        told["GPULAUNCH_MEMBERSHIP_FILE"] = layout.membership_file
    ranks = tuple(
        RankSpec(
            rank=first + i,
            local_rank=i,
            unit=names.rank_scope(first + i),
            argv=argv,
            env=rank_environment(
                {**base_env, **places[i].env, **told},
                RankPlace(
                    rank=first + i,
                    local_rank=i,
                    world_size=world,
                    local_world_size=nproc,
                    group_rank=node_rank,
                    group_world_size=nnodes,
                ),
                job=job,
                unit=names.rank_scope(first + i),
                master_addr=addr,
                master_port=port,
                max_restarts=opts.max_restarts,
                run_id=node_config.run_id if node_config else None,
                use_agent_store=agent_store,
            ),
            gpu=places[i].gpu_index,
            cpus=places[i].cpus,
            device_allow=places[i].device_allow,
        )
        for i in range(nproc)
    )
    return JobSpec(
        job=job,
        names=names,
        manager=opts.manager,
        argv=argv,
        cwd=cwd,
        nproc=nproc,
        world_size=world,
        master_addr=addr,
        master_port=port,
        grace_sec=opts.grace_sec,
        ranks=ranks,
        memory_max=opts.memory_max,
        job_memory_max=opts.job_memory_max,
        max_restarts=opts.max_restarts,
        command=(("-m",) if opts.launch is Launch.MODULE else ()) + (opts.script, *opts.args),
        node_config=node_config,
        layout=layout,
        signal_whole_rank=opts.signal_whole_rank,
        stdin_rank=opts.stdin_rank,
        stragglers=opts.stragglers,
        gpu_job_map=opts.schedulers.gpu_job_map,
        termination_log=termination_path(opts.schedulers.termination_log, os.environ),
    )


def check_target(launch: Launch, target: str, cwd: str, env: Mapping[str, str]) -> None:
    """The script exists, or the program is on PATH (modules are found by the rank)."""
    if launch is Launch.MODULE:
        return
    if launch is Launch.NO_PYTHON:
        if "/" in target:
            _check_program(Path(cwd, target), target)
        elif shutil.which(target, path=env.get("PATH", os.defpath)) is None:
            raise UsageError(
                f"program {target} not found on PATH (--no-python runs it directly)",
                "give a program on PATH or the path of an executable",
            )
        return
    script = Path(cwd, target)
    try:
        os.stat(script)
    except OSError as exc:
        if exc.errno not in (errno.ENOENT, errno.ENOTDIR):  # a name too long, a loop, ...
            raise UsageError(
                f"script {target}: {exc.strerror}", "give the path of a Python script"
            ) from None
    if not script.is_file():
        what = "is a directory" if script.is_dir() else "does not exist"
        raise UsageError(f"script {target} {what}", "give the path of a Python script")


def _check_program(path: Path, target: str) -> None:
    """--no-python with a path: an executable file (not "not found" for a mode-644 one)."""
    try:
        st = os.stat(path)
    except OSError as exc:
        what = "not found" if exc.errno in (errno.ENOENT, errno.ENOTDIR) else exc.strerror
        raise UsageError(
            f"program {target}: {what} (--no-python runs it directly)",
            "give a program on PATH or the path of an executable",
        ) from None
    if stat.S_ISDIR(st.st_mode):
        raise UsageError(f"program {target} is a directory", "give the path of an executable")
    if not os.access(path, os.X_OK):
        raise UsageError(
            f"program {target} is not executable (--no-python runs it directly)",
            f"chmod +x {target}, or leave out --no-python to run a Python script",
        )


def resolve_nproc(
    nproc: int | str, resources: Resources, env: Mapping[str, str], machine: Machine
) -> int:
    """torchrun's --nproc-per-node: a number, `gpu`, `cpu` or `auto` (GPUs if any, else CPUs)."""
    if isinstance(nproc, int):
        if nproc < 1:
            raise UsageError(f"--nproc must be at least 1, not {nproc}")
        return nproc
    cpus = os.cpu_count() or 1
    if nproc == "cpu":
        return cpus
    if resources.gpus is not None:
        gpus = len(resources.gpus)
    else:
        gpus = len(visible_pool(machine.inventory.gpus(), env.get("CUDA_VISIBLE_DEVICES")))
    if nproc == "auto":
        return gpus or cpus
    if gpus == 0:
        raise UsageError(
            "--nproc-per-node gpu: no GPU found (neither NVML nor /proc/driver/nvidia shows "
            "one, or CUDA_VISIBLE_DEVICES hides them)",
            "give a number of ranks, or `cpu`",
        )
    return gpus


def default_environment() -> dict[str, str]:
    """The launcher's own environment, which every rank starts from."""
    return dict(os.environ)


def working_directory() -> str:
    """The directory the ranks start in: ours, which must still exist."""
    try:
        return os.getcwd()
    except OSError as exc:  # deleted (ENOENT), or no longer reachable (EACCES)
        raise UsageError(
            f"cannot start in this working directory: {exc.strerror} (was it deleted?)",
            "cd to a directory that exists and start again",
        ) from None
