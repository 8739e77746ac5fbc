"""gpulaunch/warm/fit.py: which ranks may start warm (pure rules)."""

from __future__ import annotations

import pytest

from gpulaunch.plan.environment import RankPlace, attempt_environment, rank_environment
from gpulaunch.warm.fit import differs, modules_option, python_command, warm_environment

PY = "/venv/bin/python"


def env_of(rank: int, base: dict[str, str], attempt: int = 0) -> dict[str, str]:
    place = RankPlace(rank=rank, local_rank=rank, world_size=4, local_world_size=4)
    env = rank_environment(base, place, job="j", unit=f"u{rank}", master_addr="h", master_port=1)
    return attempt_environment(env, attempt, f"/run/err/{attempt}/{rank}")


def test_every_rank_and_attempt_of_a_job_fits_its_warm_process() -> None:
    base = {"PATH": "/bin", "TORCH_LOGS": "+dynamo"}
    warm = warm_environment(env_of(0, base))
    assert warm["OMP_NUM_THREADS"] == "1" and warm["TORCH_LOGS"] == "+dynamo"
    assert "RANK" not in warm and "GPULAUNCH_UNIT" not in warm
    for rank in range(4):
        for attempt in (0, 3):
            env = {**env_of(rank, base, attempt), "NOTIFY_SOCKET": "/x", "COLUMNS": "80"}
            assert differs(warm, env) is None


@pytest.mark.parametrize(
    "name", ["OMP_NUM_THREADS", "MKL_NUM_THREADS", "PYTHONHASHSEED", "TORCH_LOGS", "HF_HOME"]
)
def test_a_variable_read_at_import_that_differs_starts_cold(name: str) -> None:
    warm = warm_environment(env_of(0, {"PATH": "/bin"}))
    assert differs(warm, {**env_of(1, {"PATH": "/bin"}), name: "7"}) == (
        f"its {name} differs from the warm process's"
    )
    assert differs({**warm, name: "7"}, env_of(1, {"PATH": "/bin"})) is not None  # gone too


def test_several_that_differ_are_named_up_to_three() -> None:
    env = {"A": "1", "B": "1", "C": "1", "D": "1"}
    assert differs({}, env) == "its A, B, C and 1 more differ from the warm process's"


def test_what_a_warm_rank_can_become() -> None:
    assert python_command([PY, "-u", "train.py", "--lr", "1"], PY) is None
    assert python_command([PY, "-u", "-m", "pkg.train"], PY) is None
    assert python_command([PY, "-u", "-m"], PY) is not None
    assert python_command(["./train.sh"], PY) == (
        "its command is not `python -u SCRIPT` (--no-python)"
    )
    assert python_command(["/other/python", "-u", "t.py"], PY) is not None
    assert python_command([PY, "-u", "-c", "import runpy", "t.py"], PY) == (
        "its command runs python -c (--run-path)"
    )


def test_preload_names_modules() -> None:
    assert modules_option("torch, numpy,,pkg.sub") == ("torch", "numpy", "pkg.sub")
    with pytest.raises(ValueError, match="not a module name: 'a-b'"):
        modules_option("a-b")
