"""`srun --ntasks-per-node=1 python train.py` with `Trainer(strategy="gpulaunch", num_nodes=2)`
under a real Slurm of two nodes (tests/integration/slurm.py; issue 31).

In each node's task Lightning detects SLURM (one task per node), and the strategy makes
that process the node's gpulaunch watcher, which reads the node's place from SLURM: four
ranks, two per node, each one Lightning's DDP with torchelastic's environment.
"""

from __future__ import annotations

import json
import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.jobs import REPO, SHARED
from tests.integration.slurm import Cluster, slurm_cluster

pytestmark = pytest.mark.integration

SCRIPT = str(REPO / "tests" / "integration" / "scripts" / "lightning_strategy.py")


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    with slurm_cluster(2) as c:
        yield c


def test_num_nodes_2_under_srun_one_task_per_node(cluster: Cluster) -> None:
    jobdir = SHARED / f"slurm-lightning-{uuid.uuid4().hex[:6]}"
    jobdir.mkdir(parents=True)
    os.chmod(jobdir, 0o777)
    script = [sys.executable, SCRIPT, "--dir", str(jobdir), "--num-nodes", "2", "--steps", "4"]
    res = cluster.run(["srun", "-N", "2", "--ntasks-per-node", "1", *script], timeout=300)
    assert res.returncode == 0, res.stderr[-4000:]
    ranks = {r: json.loads(Path(jobdir, f"rank{r}.json").read_text()) for r in range(4)}
    hosts = [ranks[r]["host"] for r in range(4)]
    assert hosts == [cluster.hosts[0]] * 2 + [cluster.hosts[1]] * 2, hosts
    for rank, seen in ranks.items():
        assert seen["WORLD_SIZE"] == "4" and seen["LOCAL_RANK"] == str(rank % 2), seen
    for rank in range(4):
        done = json.loads(Path(jobdir, f"done{rank}.json").read_text())
        assert done["world_size"] == 4 and done["environment"] == "TorchElasticEnvironment"
    # each node's task became that node's watcher: the parent of its two ranks
    assert ranks[0]["ppid"] == ranks[1]["ppid"] and ranks[2]["ppid"] == ranks[3]["ppid"]
    assert "direct supervisor" in res.stderr  # inside a Slurm step, gpulaunch's own
