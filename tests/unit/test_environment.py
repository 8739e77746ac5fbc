from __future__ import annotations

from gpulaunch.plan.environment import RankPlace, rank_environment


def env(base: dict[str, str], rank: int = 1, n: int = 4) -> dict[str, str]:
    return rank_environment(
        base,
        RankPlace(rank=rank, local_rank=rank, world_size=n, local_world_size=n),
        job="j",
        unit="gpulaunch-j-rank1.scope",
        master_addr="127.0.0.1",
        master_port=29500,
    )


def test_torchrun_contract() -> None:
    e = env({"PATH": "/bin"})
    expected = {
        "RANK": "1",
        "LOCAL_RANK": "1",
        "WORLD_SIZE": "4",
        "LOCAL_WORLD_SIZE": "4",
        "GROUP_RANK": "0",
        "GROUP_WORLD_SIZE": "1",
        "ROLE_RANK": "1",
        "ROLE_WORLD_SIZE": "4",
        "ROLE_NAME": "default",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "29500",
        "TORCHELASTIC_RUN_ID": "j",
        "TORCHELASTIC_RESTART_COUNT": "0",
        "TORCHELASTIC_MAX_RESTARTS": "0",
        "GPULAUNCH_JOB": "j",
        "OMP_NUM_THREADS": "1",
        "PATH": "/bin",
    }
    assert expected.items() <= e.items()


def test_user_omp_threads_kept_and_base_not_mutated() -> None:
    base = {"OMP_NUM_THREADS": "8"}
    assert env(base)["OMP_NUM_THREADS"] == "8"
    assert base == {"OMP_NUM_THREADS": "8"}


def test_single_rank_gets_no_omp_default() -> None:
    assert "OMP_NUM_THREADS" not in env({}, rank=0, n=1)
