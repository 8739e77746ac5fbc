"""torchrun's environment contract, per rank.

Ranks get the variables torchrun (torch/distributed/run.py and
elastic/agent/server/local_elastic_agent.py) sets for a single-node launch, so
unchanged scripts and Lightning's TorchElasticEnvironment work. Pure: it reads
nothing from `os.environ`; the caller passes the base environment in.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class RankPlace:
    """Where one rank sits in the job."""

    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    group_rank: int = 0
    group_world_size: int = 1


def rank_environment(
    base: Mapping[str, str],
    place: RankPlace,
    *,
    job: str,
    unit: str,
    master_addr: str,
    master_port: int,
    restart_count: int = 0,
    max_restarts: int = 0,
    run_id: str | None = None,
    use_agent_store: bool = False,
) -> dict[str, str]:
    """The full environment of one rank: `base` plus the launcher's variables."""
    env = dict(base)
    env.update(
        {
            "RANK": str(place.rank),
            "LOCAL_RANK": str(place.local_rank),
            "WORLD_SIZE": str(place.world_size),
            "LOCAL_WORLD_SIZE": str(place.local_world_size),
            "GROUP_RANK": str(place.group_rank),
            "GROUP_WORLD_SIZE": str(place.group_world_size),
            "ROLE_NAME": "default",
            "ROLE_RANK": str(place.rank),
            "ROLE_WORLD_SIZE": str(place.world_size),
            "MASTER_ADDR": master_addr,
            "MASTER_PORT": str(master_port),
            "TORCHELASTIC_RUN_ID": run_id or job,
            "TORCHELASTIC_RESTART_COUNT": str(restart_count),
            "TORCHELASTIC_MAX_RESTARTS": str(max_restarts),
            # Single node: the ranks create the TCPStore themselves (rank 0 serves
            # it). Multi-node: as torchrun's rendezvous says (a peer serves it).
            "TORCHELASTIC_USE_AGENT_STORE": str(use_agent_store),
            "GPULAUNCH_JOB": job,
            "GPULAUNCH_UNIT": unit,
        }
    )
    if omp_default_applies(base, place.local_world_size):
        # torchrun's default, so N ranks do not oversubscribe the CPUs N-fold.
        env["OMP_NUM_THREADS"] = "1"
    # What torchrun's agent also sets (torch/distributed/run.py, elastic/agent).
    env.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
    env.setdefault("TORCHELASTIC_SIGNALS_TO_HANDLE", "SIGTERM,SIGINT,SIGHUP,SIGQUIT")
    return env


def omp_default_applies(base: Mapping[str, str], local_world_size: int) -> bool:
    """Whether ranks get OMP_NUM_THREADS=1 (and the user torchrun's warning about it)."""
    return "OMP_NUM_THREADS" not in base and local_world_size > 1


def attempt_environment(env: Mapping[str, str], attempt: int, error_file: str) -> dict[str, str]:
    """A rank's environment for one attempt of the gang (torchrun's restart contract)."""
    return {
        **env,
        "TORCHELASTIC_RESTART_COUNT": str(attempt),
        "TORCHELASTIC_ERROR_FILE": error_file,
    }
