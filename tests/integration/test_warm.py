"""Warm ranks (`--preload`, gpulaunch/warm/) under both supervisors, in a real systemd.

A warm rank is a fork of the job's warm process (which imported torch): its script must
see what `python -u SCRIPT ARGS` would show it (sys.argv, __file__, __spec__,
sys.path[0], sys.orig_argv, its environment), be in its own scope or cgroup before its
first line, have its own stdin/stdout/stderr, exit and die exactly as it did, spawn
with multiprocessing, and restart warm; where the warm start is not safe, the job
starts cold with one line that says why.
"""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.integration.container import container
from tests.integration.jobs import REPO, SHARED, Job, assert_clean
from tests.integration.shared import (
    CGROUP_LINE,
    Login,
    assert_user_clean,
    gpulaunch,
    login,
    ujob,
)

pytestmark = pytest.mark.integration
__all__ = ["login", "ujob"]  # fixtures

SCRIPTS = REPO / "tests" / "integration" / "scripts"
WARM_RANK = str(SCRIPTS / "warm_rank.py")
SUPERVISORS = ["systemd", "direct"]


def run(
    job: Job,
    supervisor: str,
    *opts: str,
    env: tuple[str, ...] = (),
    script_args: tuple[str, ...] | list[str] = (),
    input: str = "",
) -> Any:
    argv = job.argv(
        "--supervisor", supervisor, "--grace", "5", *opts, script=WARM_RANK,
        script_args=script_args,
    )  # fmt: skip
    return job.box.run(
        ["env", *env, *argv], cwd=str(REPO), capture_output=True, text=True, timeout=180,
        input=input,
    )  # fmt: skip


def seen(job: Job, rank: int, attempt: int = 0) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((job.dir / f"rank{rank}.a{attempt}.json").read_text())
    return data


def contained(job: Job, supervisor: str, rank: int, s: dict[str, Any]) -> bool:
    """In its own scope (systemd), else in its own process group (the direct supervisor in
    the box: no cgroup of its own there), and its parent (the watcher) beside the warm
    process, at the rank's first line."""
    [warm] = s["warm_processes"]
    if supervisor == "systemd":
        beside = f"/{job.names.stem}-watcher.scope"
        ok = s["cgroup"].endswith(f"/{job.names.stem}-rank{rank}.scope")
        return ok and s["parent_cgroup"].endswith(beside) and warm.endswith(beside)
    return bool(s["own_group"]) and warm.endswith(" " + s["parent_cgroup"])


@pytest.mark.parametrize("supervisor", SUPERVISORS)
def test_a_warm_rank_is_its_script_as_python_runs_it(job: Job, supervisor: str) -> None:
    res = run(
        job, supervisor, "--nproc", "2", "--preload", "json",
        script_args=["--exit-rank", "1", "--code", "7", "x y"],
    )  # fmt: skip
    assert res.returncode == 7, res.stderr
    assert "starts cold" not in res.stderr and "Traceback" not in res.stderr, res.stderr
    for rank in (0, 1):
        s = seen(job, rank)
        assert s["warm"], s  # torch was imported before its first line: a fork
        args = ["--dir", str(job.dir), "--exit-rank", "1", "--code", "7", "x y"]
        assert s["argv"] == [WARM_RANK, *args]
        assert s["orig_argv"][1:] == ["-u", WARM_RANK, *args]
        assert s["cmdline"] == s["orig_argv"]  # ps shows the rank, not the warm process
        assert s["file"] == WARM_RANK and s["spec"] is None
        assert s["path0"] == str(SCRIPTS)
        assert s["env"]["RANK"] == str(rank) and s["env"]["LOCAL_RANK"] == str(rank)
        assert s["env"]["WORLD_SIZE"] == "2"
        assert contained(job, supervisor, rank, s), s
        assert not s["stdout_isatty"] and s["stdout_name"] == "<stdout>"
        assert f"[{rank}] rank {rank} says hello on stdout" in res.stdout + res.stderr
        assert f"[{rank}] rank {rank} says hello on stderr" in res.stderr
        assert f"{s['pid']}" in res.stderr  # the report's pid is the script's own
    assert "rank 1 exit 7" in res.stderr, res.stderr


@pytest.mark.parametrize("supervisor", SUPERVISORS)
def test_a_warm_rank_dies_of_its_own_signal(job: Job, supervisor: str) -> None:
    res = run(
        job, supervisor, "--nproc", "2", "--preload", "json",
        script_args=["--kill-rank", "0", "--signal", "SIGUSR1"],
    )  # fmt: skip
    assert res.returncode == 128 + 10, res.stderr
    assert "rank 0 SIGUSR1" in res.stderr, res.stderr
    assert seen(job, 0)["warm"]


@pytest.mark.parametrize(
    ("how", "status", "last"),
    [
        ("--raise-rank", 1, "RuntimeError: rank 0 raises"),
        ("--interrupt-rank", 130, "KeyboardInterrupt"),
    ],
)
def test_a_warm_rank_raises_as_python_shows_it(job: Job, how: str, status: int, last: str) -> None:
    res = run(
        job, "systemd", "--nproc", "1", "--preload", "json", script_args=(how, "0"),
        env=("OMP_NUM_THREADS=1",),  # one rank: else OpenBLAS's threads (see the test below)
    )  # fmt: skip
    assert res.returncode == status, res.stderr  # 130: it died of SIGINT, as CPython does
    assert seen(job, 0)["warm"], res.stderr
    tb = res.stderr[res.stderr.index("[0] Traceback") :].splitlines()
    # the first frame is the script's, as in a cold start (none of the warm process's)
    assert tb[1].startswith(f'[0]   File "{WARM_RANK}", line'), tb
    assert "server.py" not in res.stderr and f"[0] {last}" in tb, tb


@pytest.mark.parametrize("supervisor", SUPERVISORS)
def test_stdin_and_spawn_in_a_warm_rank(job: Job, supervisor: str) -> None:
    res = run(
        job, supervisor, "--nproc", "2", "--preload", "json",
        script_args=["--read-stdin", "--spawn"], input="to rank zero\n",
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    s = seen(job, 0)
    assert s["warm"] and s["stdin"] == "to rank zero\n"
    assert s["spawned"] == [42] and seen(job, 1)["spawned"] == [42]


def test_a_module_runs_warm_as_python_m(job: Job) -> None:
    pkg = job.dir / "warmpkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "main.py").write_text(Path(WARM_RANK).read_text())
    argv = ["env", "OMP_NUM_THREADS=1", *job.argv("--preload", "json", "-m", script="warmpkg.main")]
    res = job.box.run(argv, cwd=str(job.dir), capture_output=True, text=True, timeout=180)
    assert res.returncode == 0, res.stderr
    s = json.loads((job.dir / "rank0.a0.json").read_text())
    assert s["warm"] and s["spec"] == "warmpkg.main", res.stderr
    assert s["file"] == str(pkg / "main.py") and s["argv"][0] == str(pkg / "main.py")
    assert s["path0"] == str(job.dir) and s["orig_argv"][1:4] == ["-u", "-m", "warmpkg.main"]


@pytest.mark.parametrize("supervisor", SUPERVISORS)
def test_a_restart_is_warm_too(job: Job, supervisor: str) -> None:
    res = run(
        job, supervisor, "--nproc", "2", "--preload", "json", "--max-restarts", "1",
        script_args=["--exit-rank", "1", "--code", "3", "--fail-attempt", "0"],
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    first, second = seen(job, 1, 0), seen(job, 1, 1)
    assert first["warm"] and second["warm"], (first, second)
    assert first["warm_processes"] == second["warm_processes"]  # the same one, outlived
    assert contained(job, supervisor, 1, second), second


@pytest.mark.parametrize("supervisor", SUPERVISORS)
def test_an_unsafe_warm_process_starts_cold_with_one_line(job: Job, supervisor: str) -> None:
    res = run(
        job, supervisor, "--nproc", "2", "--preload", "warm_thread",
        env=(f"PYTHONPATH={SCRIPTS}",),
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    lines = [line for line in res.stderr.splitlines() if "cold" in line]
    assert lines == [
        "gpulaunch: warm start off, ranks start cold: the imports started 1 thread, "
        "and a fork keeps only one (OpenBLAS starts its pool unless "
        "OMP_NUM_THREADS=1, as gpulaunch sets for several ranks)"
    ], res.stderr
    assert not seen(job, 0)["warm"] and not seen(job, 1)["warm"]


def test_a_module_that_does_not_import_starts_cold(job: Job) -> None:
    res = run(job, "systemd", "--nproc", "1", "--preload", "no_such_module_here")
    assert res.returncode == 0, res.stderr
    assert (
        "gpulaunch: warm start off, ranks start cold: --preload no_such_module_here: "
        "ModuleNotFoundError" in res.stderr
    ), res.stderr
    assert not seen(job, 0)["warm"]


def test_without_preload_ranks_start_cold(job: Job) -> None:
    res = run(job, "systemd", "--nproc", "1", "--preload", "json", "--no-preload")
    assert res.returncode == 0, res.stderr
    assert not seen(job, 0)["warm"] and "warm" not in res.stderr
    assert os.path.exists(job.dir / "rank0.a0.json")


def test_a_stop_while_the_warm_process_imports_forks_no_rank(job: Job) -> None:
    """SIGTERM to the watcher while its warm process imports (a module that takes 10
    minutes): the job stops at once (143), no rank ran, nothing is left."""
    argv = ["env", f"PYTHONPATH={SCRIPTS}", *job.argv("--preload", "warm_slow", script=WARM_RANK)]
    proc = job.box.popen(argv, cwd=str(REPO), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    find = f"pgrep -f '^gpulaunch-warm {job.id}' | head -1 | xargs -r ps -o ppid= -p"
    watcher = ""
    while not watcher.strip() and proc.poll() is None:
        watcher = job.box.run(["sh", "-c", find], capture_output=True, text=True).stdout
    job.box.run(["kill", "-TERM", watcher.strip()], check=True)
    _, err = proc.communicate(timeout=120)  # runaway cap: the import alone takes 600 s
    assert proc.returncode == 143, err
    assert not list(job.dir.glob("rank*.json")), err
    assert_clean(job)


PROGRAMS = {
    "ddp": (["--steps", "3"], "torch"),
    "warm_loader": ([], "torch"),
    "warm_compile": ([], "torch"),
    "lightning_trainer": (["--devices", "2"], "torch,lightning"),
    "lightning_fabric": (["--devices", "2"], "torch,lightning"),
}


@pytest.mark.parametrize("program", sorted(PROGRAMS))
def test_programs_run_warm(job: Job, program: str) -> None:
    """DDP, DataLoader workers, a forkserver, torch.compile, Lightning's Trainer and Fabric:
    warm, as cold."""
    args, preload = PROGRAMS[program]
    argv = job.argv(
        "--nproc", "2", "--preload", preload, script=str(SCRIPTS / f"{program}.py"),
        script_args=args,
    )  # fmt: skip
    res = job.box.run(argv, cwd=str(REPO), capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert "cold" not in res.stderr and "Traceback" not in res.stderr, res.stderr


def test_warm_ranks_in_the_direct_supervisors_cgroups() -> None:
    """The direct supervisor with cgroups of its own (a container's writable cgroup2): each
    warm rank is in its own cgroup at its first line, the warm process in the watcher's,
    and nothing is left."""
    work = SHARED / f"warm-direct-{uuid.uuid4().hex[:8]}"
    work.mkdir(parents=True)
    with container() as ct:
        res = ct.run(
            gpulaunch(work, "start", "--nproc", "2", "--preload", "json", WARM_RANK,
                      "--dir", str(work), "--exit-rank", "1", "--code", "5")
        )  # fmt: skip
        assert res.returncode == 5, res.stdout
        assert CGROUP_LINE in res.stdout and "cold" not in res.stdout, res.stdout
        for rank in (0, 1):
            s = json.loads((work / f"rank{rank}.a0.json").read_text())
            assert s["warm"] and s["cgroup"].endswith(f"/rank{rank}"), s
            assert s["parent_cgroup"].endswith("/watcher"), s
            [warm] = s["warm_processes"]
            assert warm.endswith("/watcher"), s
        assert ct.leftovers() == []


def test_an_ordinary_users_job_starts_warm(login: Login, ujob: Job) -> None:
    """From a login shell (the front end; the watcher a service of the user manager): the
    warm process lives where that manager can move its ranks from, each in its scope."""
    res = login.run(ujob.argv("--nproc", "2", "--preload", "json", script=WARM_RANK))
    assert res.returncode == 0, res.stderr
    assert "cold" not in res.stderr, res.stderr
    for rank in (0, 1):
        s = seen(ujob, rank)
        assert s["warm"] and s["cgroup"].endswith(f"/{ujob.names.stem}-rank{rank}.scope"), s
        [warm] = s["warm_processes"]
        assert warm.endswith(f"/{ujob.names.stem}-watcher.scope"), s
    assert_user_clean(login, ujob)
