"""Check 5: what the live view says of each rank's GPU use, against nvidia-smi.

`gpulaunch status --resources --json` reads per-process GPU accounting through
NVML (gpulaunch/resources/nvml.py), the same source as `nvidia-smi
--query-compute-apps`: each rank's GPU memory must be what nvidia-smi lists for
its processes. Where the job runs in a pid namespace of its own (the test box, a
container), NVML's host pids are not the job's: then the view must say so once,
never show zeros.
"""

from __future__ import annotations

import json
import signal
import subprocess
from collections.abc import Callable

import pytest

from gpulaunch.resources.sample import nested_pid_namespace
from tests.gpu import nvsmi
from tests.gpu.test_jobs import hold
from tests.integration.jobs import GPULAUNCH, Job

pytestmark = pytest.mark.gpu
MEMORY_QUERY = ["--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"]


def in_own_pid_namespace(job: Job) -> bool:
    """Whether the job's processes live in a pid namespace below this one (the box)."""
    out = job.box.run(["cat", "/proc/self/status"], capture_output=True, text=True, check=True)
    mine = nested_pid_namespace()
    theirs = next(line for line in out.stdout.splitlines() if line.startswith("NSpid:"))
    return len(theirs.split()) > 2 and not mine


@pytest.mark.gpu(needs=("pystemd",))
def test_gpu_memory_per_rank_equals_nvidia_smi(job: Job, finding: Callable[[str], None]) -> None:
    pids, proc = hold(job)  # two ranks, each holding 256 MiB through libcuda
    try:
        res = job.box.run(
            [GPULAUNCH, "status", "--resources", "--json", job.id],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert res.returncode == 0, res.stderr
        sample = json.loads(res.stdout)["resources"]
        smi = nvsmi.parse_app_memory(nvsmi.run(MEMORY_QUERY))
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
    if in_own_pid_namespace(job):
        assert "pid namespace" in sample["missing"].get("gpu", ""), sample
        assert all(r["gpu_memory"] is None for r in sample["ranks"]), sample
        finding(f"job in its own pid namespace: GPU column says {sample['missing']['gpu']!r}")
        return
    mib = {r["rank"]: r["gpu_memory"] for r in sample["ranks"]}
    expected = sum(smi[pid] for pid in pids) << 20
    assert all(v is not None for v in mib.values()), sample
    total = sum(v for v in mib.values() if v is not None)
    assert abs(total - expected) <= 0.05 * expected, (mib, smi)
    for r in sample["ranks"]:
        assert r["gpu_util"] is None or 0 <= r["gpu_util"] <= 100 * len(pids), r
    finding(f"GPU memory per rank (bytes) {mib}; nvidia-smi: {smi} MiB for pids {sorted(pids)}")
