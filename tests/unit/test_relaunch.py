"""strategy="gpulaunch": who becomes the watcher, and the command line it runs (pure logic),
plus Lightning's real connectors choosing the launcher (no processes started)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpulaunch.cli import build_parser
from gpulaunch.integrations.relaunch import (
    RelaunchError,
    Role,
    WatcherOptions,
    job_label,
    node_args,
    rank_command,
    role,
    watcher_argv,
)
from gpulaunch.plan.spec import Launch

PY = "/opt/py/bin/python3"
RANK_ENV = {"GPULAUNCH_JOB": "j", "LOCAL_RANK": "1"}


@pytest.mark.parametrize(
    ("env", "externally", "slurm", "nproc", "expected"),
    [
        ({}, False, False, 2, Role.WATCHER),  # `python train.py`
        (RANK_ENV, True, False, 2, Role.RANK),  # a rank gpulaunch started
        ({"LOCAL_RANK": "0"}, True, False, 2, Role.RANK),  # torchrun, or a spawned rank
        ({"SLURM_NTASKS": "2", "SLURM_NNODES": "2"}, True, True, 4, Role.WATCHER),
        ({"SLURM_STEP_NUM_TASKS": "8", "SLURM_STEP_NUM_NODES": "2"}, True, True, 4, Role.RANK),
        ({"SLURM_NTASKS": "1", "SLURM_NNODES": "1"}, True, True, 1, Role.WATCHER),
        ({**RANK_ENV, "SLURM_NTASKS": "3", "SLURM_NNODES": "1"}, True, True, 2, Role.RANK),
    ],
)
def test_role(
    env: dict[str, str], externally: bool, slurm: bool, nproc: int, expected: Role
) -> None:
    got = role(env, externally=externally, slurm=slurm, num_processes=nproc, num_nodes=1)
    assert got is expected


def test_srun_with_a_task_count_that_fits_neither_way_is_one_clear_error() -> None:
    with pytest.raises(RelaunchError, match="srun --ntasks-per-node=1"):
        role(
            {"SLURM_NTASKS": "3", "SLURM_NNODES": "1"},
            externally=True,
            slurm=True,
            num_processes=2,
            num_nodes=1,
        )


@pytest.mark.parametrize(
    "orig",
    [
        ["python", "train.py", "--lr", "1"],
        ["python3", "-X", "dev", "-W", "error", "train.py", "-u"],
        ["python", "-m", "pkg.train", "--x"],
        ["python", "-mpkg.train"],
        ["python", "-c", "import x", "a"],
        ["python", "-B", "/abs/train.py", "--", "-m"],
    ],
)
def test_rank_command_is_the_command_typed_with_this_python(orig: list[str]) -> None:
    assert rank_command(PY, orig) == [PY, "-u", *orig[1:]]


@pytest.mark.parametrize("orig", [["python"], ["python", "-"], ["python", "-i", "x.py"], []])
def test_a_program_from_stdin_or_a_terminal_cannot_run_again(orig: list[str]) -> None:
    with pytest.raises(RelaunchError, match="python SCRIPT"):
        rank_command(PY, orig)


@pytest.mark.parametrize(
    ("argv0", "module", "label"),
    [
        ("/home/u/train.py", None, "train"),
        ("/x/pkg/train.py", "pkg.train", "train"),
        ("/x/pkg/__main__.py", "pkg.__main__", "pkg"),
        ("-c", None, "python"),
    ],
)
def test_job_label(argv0: str, module: str | None, label: str) -> None:
    assert job_label(argv0, module) == label


def test_node_args() -> None:
    assert node_args({}, slurm=False, num_nodes=1) == []
    env = {"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29400"}
    assert node_args(env, slurm=False, num_nodes=1) == [
        "--master-addr",
        "10.0.0.1",
        "--master-port",
        "29400",
    ]
    assert node_args({**env, "NODE_RANK": "1"}, slurm=False, num_nodes=2) == [
        "--nnodes",
        "2",
        "--node-rank",
        "1",
        "--master-addr",
        "10.0.0.1",
        "--master-port",
        "29400",
    ]
    assert node_args({"SLURM_NODEID": "1"}, slurm=True, num_nodes=2) == ["--nnodes", "2"]
    with pytest.raises(RelaunchError, match="NODE_RANK and MASTER_ADDR"):
        node_args({"MASTER_ADDR": "h"}, slurm=False, num_nodes=2)


def test_watcher_argv_is_a_start_command_gpulaunch_parses() -> None:
    options = WatcherOptions(
        grace=2.5,
        memory_max="1G",
        log_dir="/tmp/logs",
        hang_timeout=600,
        max_restarts=1,
        supervisor="systemd",
        extra_args=("--quiet",),
    )
    command = [PY, "-u", "-X", "dev", "train.py", "--lr", "1", "--", "-x"]
    argv = watcher_argv(
        PY, nproc=3, nodes=["--nnodes", "1"], options=options, command=command, job="train_abc"
    )
    assert argv[:4] == [PY, "-m", "gpulaunch", "start"]
    args = build_parser().parse_args(argv[3:])
    assert args.launch is Launch.NO_PYTHON
    assert [args.script, *args.args] == command
    assert (args.nproc, args.job, args.grace, args.memory_max) == (3, "train_abc", 2.5, "1G")
    assert (args.hang_timeout, args.max_restarts, args.supervisor) == (600, 1, "systemd")
    assert str(args.log_dir) == "/tmp/logs" and args.quiet


@pytest.fixture
def lightning_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in ("LOCAL_RANK", "GPULAUNCH_JOB", "TORCHELASTIC_RUN_ID", "SLURM_NTASKS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SLURM_JOB_NAME", "interactive")  # no SLURMEnvironment on this host
    yield


def test_trainer_and_fabric_by_name_get_the_watcher_launcher(lightning_env: None) -> None:
    import lightning as L

    from gpulaunch.integrations import lightning as integration

    trainer = L.Trainer(strategy="gpulaunch", accelerator="cpu", devices=2, logger=False)
    assert isinstance(trainer.strategy, integration.GpulaunchStrategy)
    assert isinstance(trainer.strategy.launcher, integration._GpulaunchTrainerLauncher)
    assert trainer.strategy.num_processes == 2
    fabric = L.Fabric(strategy="gpulaunch", accelerator="cpu", devices=3)
    assert isinstance(fabric.strategy, integration.GpulaunchFabricStrategy)
    assert isinstance(fabric.strategy.launcher, integration._GpulaunchFabricLauncher)


def test_in_a_rank_the_strategy_is_lightnings_ddp(
    lightning_env: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import lightning as L

    for name, value in {
        **RANK_ENV,
        "RANK": "1",
        "WORLD_SIZE": "2",
        "LOCAL_WORLD_SIZE": "2",
        "GROUP_RANK": "0",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "29500",
        "TORCHELASTIC_RUN_ID": "j",
    }.items():
        monkeypatch.setenv(name, value)
    trainer = L.Trainer(strategy="gpulaunch", accelerator="cpu", devices=2, logger=False)
    assert trainer.strategy.launcher is None
    assert type(trainer.strategy.cluster_environment).__name__ == "TorchElasticEnvironment"
    assert trainer.global_rank == 1 and trainer.world_size == 2
    fabric = L.Fabric(strategy="gpulaunch", accelerator="cpu", devices=2)
    assert fabric.global_rank == 1
    assert type(fabric.strategy.launcher).__name__ == "_RankFabricLauncher"  # records failures
    launcher = fabric.strategy.launcher
    assert launcher.launch(lambda x: x + 1, 41) == 42
    error_file = tmp_path / "error.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(error_file))
    ended: list[BaseException] = []  # the rank would end at once here (teardown.py)
    monkeypatch.setattr("gpulaunch.integrations.teardown.exit_now", ended.append)
    with pytest.raises(SystemExit):
        launcher.launch(sys.exit, 7)
    assert "SystemExit: 7" in error_file.read_text()
    assert [type(e) for e in ended] == [SystemExit]


def test_devices_auto_on_cpu_is_one_rank_and_options_reach_the_watcher(
    lightning_env: None,
) -> None:
    import lightning as L

    from gpulaunch.integrations.lightning import GpulaunchStrategy, watcher_command

    strategy = GpulaunchStrategy(grace=3, memory_max="2G", log_dir="logs", hang_timeout=60)
    trainer = L.Trainer(strategy=strategy, accelerator="cpu", devices="auto", logger=False)
    assert trainer.strategy.num_processes == 1
    argv = watcher_command(strategy.gpulaunch_options, 1, 1, slurm=False)
    args = build_parser().parse_args(argv[3:])
    assert (args.nproc, args.grace, args.memory_max, args.hang_timeout) == (1, 3.0, "2G", 60)
    assert str(args.log_dir) == "logs"
    assert args.job.startswith("pytest_") or args.job.startswith("__main___")
    assert [args.script, *args.args] == rank_command(sys.executable, sys.orig_argv)


SLURM_ONE_TASK_PER_NODE = {
    "SLURM_JOB_ID": "77",
    "SLURM_JOB_NAME": "train",
    "SLURM_NTASKS": "2",
    "SLURM_NNODES": "2",
    "SLURM_NTASKS_PER_NODE": "1",
    "SLURM_PROCID": "1",
    "SLURM_LOCALID": "0",
    "SLURM_NODEID": "1",
    "SLURM_NODELIST": "n[1-2]",
}


def test_num_nodes_under_srun_one_task_per_node_makes_a_watcher_per_node(
    lightning_env: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    import lightning as L

    from gpulaunch.integrations.lightning import watcher_command

    for name, value in SLURM_ONE_TASK_PER_NODE.items():
        monkeypatch.setenv(name, value)
    trainer = L.Trainer(
        strategy="gpulaunch", accelerator="cpu", devices=3, num_nodes=2, logger=False
    )
    assert type(trainer.strategy.cluster_environment).__name__ == "SLURMEnvironment"
    launcher = trainer.strategy.launcher
    assert launcher is not None and launcher.is_interactive_compatible is False
    argv = watcher_command(trainer.strategy.gpulaunch_options, 3, 2, slurm=True)
    args = build_parser().parse_args(argv[3:])
    assert (args.nproc, args.nnodes, args.job) == (3, "2", None)  # the id: gpulaunch's, SLURM's


def test_num_nodes_elsewhere_without_node_rank_fails_at_trainer(
    lightning_env: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    import lightning as L

    monkeypatch.delenv("NODE_RANK", raising=False)
    monkeypatch.setenv("MASTER_ADDR", "10.0.0.1")
    with pytest.raises(RelaunchError, match="NODE_RANK and MASTER_ADDR"):
        L.Trainer(strategy="gpulaunch", accelerator="cpu", devices=2, num_nodes=2, logger=False)


@pytest.mark.parametrize(
    ("exc", "written"),
    [
        (SystemExit(7), True),
        (RuntimeError("boom"), True),
        (SystemExit(0), False),
        (SystemExit(None), False),
        (KeyboardInterrupt(), False),
    ],
)
def test_a_failing_rank_writes_torchelastic_s_error_file_gpulaunch_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, exc: BaseException, written: bool
) -> None:
    from gpulaunch.integrations.lightning import record_failure
    from gpulaunch.watcher.errorfile import read_error_file

    path = tmp_path / "error.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(path))
    monkeypatch.setenv("GPULAUNCH_JOB", "j")
    try:
        raise exc
    except BaseException as caught:
        record_failure(caught, caught.__traceback__)
    assert path.exists() is written
    if written:
        text = read_error_file(path)
        assert text is not None and f"{type(exc).__name__}: {exc}" in text
        assert "test_a_failing_rank_writes" in text  # the traceback


def test_outside_gpulaunch_no_error_file_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gpulaunch.integrations.lightning import record_failure

    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(tmp_path / "error.json"))
    monkeypatch.delenv("GPULAUNCH_JOB", raising=False)  # torchrun's rank: @record's business
    record_failure(RuntimeError("x"), None)
    assert not (tmp_path / "error.json").exists()
