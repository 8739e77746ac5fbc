"""`Trainer(strategy="gpulaunch")` and `Fabric(strategy="gpulaunch")`: Lightning's DDP with
gpulaunch's watcher as the parent of every rank.

Importing this module registers the name "gpulaunch" in Lightning's strategy
registries (Trainer's and Fabric's); Lightning has no entry point through which
an installed package could do that by itself (it registers only the classes of
its own modules), so a script imports it, as Lightning documents for a strategy
of one's own. Options: `GpulaunchStrategy(grace=30, memory_max="8G", ...)`.

In the process the user started (`python train.py`), the launcher `exec`s
`python -m gpulaunch start --no-python <the same command line>` at the first
`fit`/`validate`/`test`/`predict` (Trainer) or at `fabric.launch()`: the pid stays,
and it becomes the watcher of the job, forking every rank (rank 0 included) into its
own scope with gpulaunch's torchrun environment. In the ranks Lightning detects
that environment (TorchElasticEnvironment: it creates the processes externally),
so the strategy has no launcher and is exactly Lightning's DDP. Code before the
launch point runs once in the process the user started, and again in every rank
(Lightning's own launcher runs it in rank 0, the process the user started, and in
each rank it spawns).

This module imports Lightning, and so torch: only a training script imports it.
gpulaunch itself never does (tests/unit/test_no_torch.py).
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from types import TracebackType
from typing import Any, NoReturn

import lightning.fabric.strategies as fabric_strategies
import lightning.pytorch.strategies as trainer_strategies
from lightning.fabric.plugins.environments.cluster_environment import ClusterEnvironment
from lightning.fabric.plugins.environments.slurm import SLURMEnvironment
from lightning.fabric.strategies.ddp import DDPStrategy as _FabricDDPStrategy
from lightning.fabric.strategies.launchers.launcher import _Launcher as _FabricLauncher
from lightning.pytorch.strategies.launchers.launcher import _Launcher as _TrainerLauncher

from gpulaunch.integrations.relaunch import (
    Role,
    WatcherOptions,
    become_watcher,
    job_label,
    node_args,
    rank_command,
    role,
    watcher_argv,
)
from gpulaunch.integrations.teardown import failing, mark_failed, release_at_exit

STRATEGY_NAME = "gpulaunch"


def _main_module() -> str | None:
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    name = getattr(spec, "name", None)
    return name if isinstance(name, str) else None


def watcher_command(
    options: WatcherOptions, num_processes: int, num_nodes: int, slurm: bool
) -> list[str]:
    """The `gpulaunch start` line that runs the command the user typed once per rank."""
    from gpulaunch.plan.spec import generated_job_id

    job = options.job
    if job is None and num_nodes == 1:  # several nodes: gpulaunch's id, the same on each
        job = generated_job_id(job_label(sys.argv[0], _main_module()))
    return watcher_argv(
        sys.executable,
        nproc=num_processes,
        nodes=node_args(os.environ, slurm=slurm, num_nodes=num_nodes),
        options=options,
        command=rank_command(sys.executable, sys.orig_argv),
        job=job,
    )


def _relaunch(options: WatcherOptions, num_processes: int, num_nodes: int, slurm: bool) -> NoReturn:
    """Become the watcher of `num_processes` ranks running the command the user typed."""
    become_watcher(watcher_command(options, num_processes, num_nodes, slurm))


def record_failure(exc: BaseException, tb: TracebackType | None) -> None:
    """In a rank gpulaunch started: write torchelastic's error file now, as `@record` does.

    The rank is failing but has its teardown still ahead (Lightning's, then the
    interpreter's), which can take a second; meanwhile the others notice the broken
    collective, and one of them may die of it (gloo aborts: SIGABRT) before this rank
    has exited, and be taken for the cause. gpulaunch names the rank whose file came
    first the cause, with its own exit status once it exits, and waits for that exit at
    most the grace (gpulaunch/watcher/errorwatch.py). An interrupt, or an exit with status 0, is
    no error. The format is torch's (torch.distributed.elastic.multiprocessing.errors).

    Called from Trainer's `on_exception` and around Fabric's `fabric.launch(fn)`: both
    run in the failing rank before any peer can see a broken connection. A script that
    calls `fabric.launch()` bare and fails after it has no such hook (an excepthook would
    also run in the other ranks, for their "Connection closed by peer", and was seen to
    name one of them): the rank whose exit gpulaunch sees first is the cause.
    """
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path or "GPULAUNCH_JOB" not in os.environ or isinstance(exc, KeyboardInterrupt):
        return
    if isinstance(exc, SystemExit) and exc.code in (0, None):
        return
    callstack = "".join(traceback.format_exception(type(exc), exc, tb))
    data = {
        "message": {
            "message": f"{type(exc).__name__}: {exc}",
            "extraInfo": {"py_callstack": callstack, "timestamp": str(int(time.time()))},
        }
    }
    try:
        with open(path, "w") as f:
            json.dump(data, f)
    except OSError:  # the rank's status and stderr still tell what happened
        pass


def _role(env: ClusterEnvironment, num_processes: int, num_nodes: int) -> Role:
    return role(
        os.environ,
        externally=env.creates_processes_externally,
        slurm=isinstance(env, SLURMEnvironment),
        num_processes=num_processes,
        num_nodes=num_nodes,
    )


class _GpulaunchTrainerLauncher(_TrainerLauncher):
    """The Trainer's launcher in the process the user started: it becomes the watcher."""

    def __init__(self, options: WatcherOptions, num_processes: int, num_nodes: int, slurm: bool):
        self._args = (options, num_processes, num_nodes, slurm)

    @property
    def is_interactive_compatible(self) -> bool:
        return False  # the ranks run the script again: a notebook has none

    def launch(self, function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        _relaunch(*self._args)

    def kill(self, signum: Any) -> None:
        """Never reached: `launch` does not return; the watcher stops the ranks."""


class _GpulaunchFabricLauncher(_FabricLauncher):
    """Fabric's launcher in the process the user started: it becomes the watcher."""

    def __init__(self, options: WatcherOptions, num_processes: int, num_nodes: int, slurm: bool):
        self._args = (options, num_processes, num_nodes, slurm)

    @property
    def is_interactive_compatible(self) -> bool:
        return False

    def launch(self, function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        _relaunch(*self._args)


class _RankFabricLauncher(_FabricLauncher):
    """Fabric's launcher in a rank gpulaunch started: `fabric.launch(fn)` runs `fn` here,
    and a failure of it is recorded before the rank tears down (`record_failure`)."""

    @property
    def is_interactive_compatible(self) -> bool:
        return True  # it starts nothing

    def launch(self, function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        try:
            return function(*args, **kwargs)
        except BaseException as exc:
            record_failure(exc, exc.__traceback__)
            failing(exc)  # the rank ends now, with its status (integrations/teardown.py)
            raise


def _options(
    grace: float | None,
    memory_max: str | None,
    job_memory_max: str | None,
    log_dir: str | os.PathLike[str] | None,
    hang_timeout: float | None,
    job: str | None,
    max_restarts: int | None,
    supervisor: str | None,
    gpulaunch_args: tuple[str, ...] | list[str],
) -> WatcherOptions:
    return WatcherOptions(
        grace=None if grace is None else float(grace),
        memory_max=memory_max,
        job_memory_max=job_memory_max,
        log_dir=None if log_dir is None else os.fspath(log_dir),
        hang_timeout=None if hang_timeout is None else float(hang_timeout),
        job=job,
        max_restarts=max_restarts,
        supervisor=supervisor,
        extra_args=tuple(gpulaunch_args),
    )


class GpulaunchStrategy(trainer_strategies.DDPStrategy):
    """Lightning Trainer's DDP, its ranks started and supervised by gpulaunch.

    gpulaunch's options (None: its default; `gpulaunch start --help`): `grace` (seconds
    from SIGTERM to SIGKILL), `memory_max` (each rank), `job_memory_max`, `log_dir`,
    `hang_timeout`, `job` (the id), `max_restarts`, `supervisor`, and `gpulaunch_args`
    (any other `gpulaunch start` options). Other keyword arguments are DDPStrategy's.
    """

    strategy_name = STRATEGY_NAME

    def __init__(
        self,
        *,
        grace: float | None = None,
        memory_max: str | None = None,
        job_memory_max: str | None = None,
        log_dir: str | os.PathLike[str] | None = None,
        hang_timeout: float | None = None,
        job: str | None = None,
        max_restarts: int | None = None,
        supervisor: str | None = None,
        gpulaunch_args: tuple[str, ...] | list[str] = (),
        **ddp_kwargs: Any,
    ) -> None:
        super().__init__(start_method="popen", **ddp_kwargs)
        self.gpulaunch_options = _options(
            grace,
            memory_max,
            job_memory_max,
            log_dir,
            hang_timeout,
            job,
            max_restarts,
            supervisor,
            gpulaunch_args,
        )

    def _configure_launcher(self) -> None:
        env = self.cluster_environment
        assert env is not None  # Lightning's connector sets it before this
        if _role(env, self.num_processes, self.num_nodes) is Role.RANK:
            self._launcher = None  # a rank: Lightning's DDP as it is
            return
        slurm = isinstance(env, SLURMEnvironment)
        watcher_command(
            self.gpulaunch_options, self.num_processes, self.num_nodes, slurm
        )  # fail now
        self._launcher = _GpulaunchTrainerLauncher(
            self.gpulaunch_options, self.num_processes, self.num_nodes, slurm
        )

    def setup_environment(self) -> None:
        super().setup_environment()
        release_at_exit()

    def on_exception(self, exception: BaseException) -> None:
        """Lightning caught an exception (sys.exit too) in fit/validate/test/predict."""
        super().on_exception(exception)
        record_failure(exception, exception.__traceback__)
        mark_failed()


class GpulaunchFabricStrategy(_FabricDDPStrategy):
    """Lightning Fabric's DDP, its ranks started and supervised by gpulaunch (the
    options of `GpulaunchStrategy`)."""

    def __init__(
        self,
        *,
        grace: float | None = None,
        memory_max: str | None = None,
        job_memory_max: str | None = None,
        log_dir: str | os.PathLike[str] | None = None,
        hang_timeout: float | None = None,
        job: str | None = None,
        max_restarts: int | None = None,
        supervisor: str | None = None,
        gpulaunch_args: tuple[str, ...] | list[str] = (),
        **ddp_kwargs: Any,
    ) -> None:
        super().__init__(start_method="popen", **ddp_kwargs)
        self.gpulaunch_options = _options(
            grace,
            memory_max,
            job_memory_max,
            log_dir,
            hang_timeout,
            job,
            max_restarts,
            supervisor,
            gpulaunch_args,
        )

    def _configure_launcher(self) -> None:
        env = self.cluster_environment
        assert env is not None  # Fabric's connector sets it before this
        if _role(env, self.num_processes, self.num_nodes) is Role.RANK:
            # started by gpulaunch: `fabric.launch(fn)` records fn's failure (record_failure)
            rank = "GPULAUNCH_JOB" in os.environ
            self._launcher = _RankFabricLauncher() if rank else None
            return
        slurm = isinstance(env, SLURMEnvironment)
        watcher_command(
            self.gpulaunch_options, self.num_processes, self.num_nodes, slurm
        )  # fail now
        self._launcher = _GpulaunchFabricLauncher(
            self.gpulaunch_options, self.num_processes, self.num_nodes, slurm
        )

    def setup_environment(self) -> None:
        super().setup_environment()
        release_at_exit()


def register() -> None:
    """Register "gpulaunch" in Trainer's and Fabric's strategy registries (idempotent)."""
    description = "DDP with gpulaunch's watcher as the parent of every rank"
    if STRATEGY_NAME not in trainer_strategies.StrategyRegistry:
        trainer_strategies.StrategyRegistry.register(
            STRATEGY_NAME, GpulaunchStrategy, description=description
        )
    if STRATEGY_NAME not in fabric_strategies.STRATEGY_REGISTRY:
        fabric_strategies.STRATEGY_REGISTRY.register(
            STRATEGY_NAME, GpulaunchFabricStrategy, description=description
        )


register()
