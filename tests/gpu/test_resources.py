"""Check 5: what the live view says of each rank's GPU use, against nvidia-smi.

`gpulaunch status --resources --json` reads per-process GPU accounting through
NVML (gpulaunch/resources/nvml.py), the same source as `nvidia-smi
--query-compute-apps`: each rank's GPU memory must be what nvidia-smi lists for
its processes. Where the job runs in a pid namespace of its own (the test box, a
container), NVML's host pids are not the job's: then the view must say so once,
never show zeros. Each is its own check; the one that cannot run here is not applicable
(tests/gpu/gate.py: `host-pids`, `own-pid-namespace`), never "passed" without comparing.
"""

from __future__ import annotations

import json
import signal
import subprocess
from collections.abc import Callable
from typing import Any

import pytest

from tests.gpu import nvsmi
from tests.gpu.helpers import hold
from tests.integration.jobs import GPULAUNCH, Job

pytestmark = pytest.mark.gpu
MEMORY_QUERY = ["--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"]


def sample_while_holding(job: Job) -> tuple[set[int], dict[str, Any], dict[int, int]]:
    """Two ranks holding 256 MiB each: their pids, the live view's sample, nvidia-smi's MiB."""
    pids, proc = hold(job)  # two ranks, each holding 256 MiB through libcuda
    try:
        res = job.box.run(
            [GPULAUNCH, "status", "--resources", "--json", job.id],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert res.returncode == 0, res.stderr
        sample: dict[str, Any] = json.loads(res.stdout)["resources"]
        smi = nvsmi.parse_app_memory(nvsmi.run(MEMORY_QUERY))
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
    return set(pids), sample, smi


@pytest.mark.gpu(needs=("pystemd", "host-pids"))
def test_gpu_memory_per_rank_equals_nvidia_smi(job: Job, finding: Callable[[str], None]) -> None:
    """Each rank's GPU memory in the live view is what nvidia-smi lists for its processes."""
    pids, sample, smi = sample_while_holding(job)
    mib = {r["rank"]: r["gpu_memory"] for r in sample["ranks"]}
    expected = sum(smi[pid] for pid in pids) << 20
    assert expected > 0, (pids, smi)  # nvidia-smi lists the ranks: there is something to compare
    assert all(v is not None for v in mib.values()), sample
    total = sum(v for v in mib.values() if v is not None)
    assert abs(total - expected) <= 0.05 * expected, (mib, smi)
    for r in sample["ranks"]:
        assert r["gpu_util"] is None or 0 <= r["gpu_util"] <= 100 * len(pids), r
    finding(f"GPU memory per rank (bytes) {mib}; nvidia-smi: {smi} MiB for pids {sorted(pids)}")


@pytest.mark.gpu(needs=("pystemd", "own-pid-namespace"))
def test_gpu_column_in_a_pid_namespace_says_so(job: Job, finding: Callable[[str], None]) -> None:
    """In a pid namespace of its own, the view says why it has no GPU memory, never zeros."""
    _, sample, _ = sample_while_holding(job)
    assert "pid namespace" in sample["missing"].get("gpu", ""), sample
    assert all(r["gpu_memory"] is None for r in sample["ranks"]), sample
    finding(f"job in its own pid namespace: GPU column says {sample['missing']['gpu']!r}")
