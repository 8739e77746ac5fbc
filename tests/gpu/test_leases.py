"""Issue 28 on a real GPU machine: leases between jobs, the health gate, GPU accounting.

Every job holds GPU memory through libcuda (tests/gpu/scripts/cuda_rank.py, `hold`), so the
gate's "another process holds memory" and the accounting see a real rank. Where no GPU is
found these checks are deselected and reported as not applicable (tests/gpu/gate.py).
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.gpu.helpers import RANK, machine_gpus, popen
from tests.integration.jobs import GPULAUNCH, REPO, Job, wait_until

pytestmark = pytest.mark.gpu


def argv(job: Job, name: str, *opts: str) -> list[str]:
    d = job.dir / name
    d.mkdir(exist_ok=True)
    return [GPULAUNCH, "start", "--job", f"{job.id}-{name}", *opts, RANK, "--dir", str(d)]


def holding(job: Job, name: str, *opts: str) -> subprocess.Popen[str]:
    """A job of one rank holding 256 MiB on its GPU, running until stopped."""
    proc = popen(job, [*argv(job, name, *opts), "--mode", "hold"])
    ready = job.dir / name / "rank0.ready"
    wait_until(lambda: ready.exists() or proc.poll() is not None, 120, f"{name} holding")
    assert proc.poll() is None, proc.communicate()[1][-3000:]
    return proc


def run(job: Job, name: str, *opts: str) -> subprocess.CompletedProcess[str]:
    return job.box.run(
        [*argv(job, name, *opts), "--mode", "probe"],
        cwd=str(REPO), capture_output=True, text=True, timeout=240,
    )  # fmt: skip


def stop(job: Job, proc: subprocess.Popen[str], name: str) -> None:
    from gpulaunch.base.names import UnitNames

    job.box.run(["systemctl", "stop", UnitNames.for_job(f"{job.id}-{name}").job_slice])
    proc.communicate(timeout=120)


@pytest.mark.gpu(needs=("pystemd",))
def test_leases_on_the_real_gpus(job: Job, finding: Callable[[str], None]) -> None:
    """auto:1 leases a GPU; asking for every GPU then is refused naming the holder; a
    SIGKILLed watcher's GPU goes to a waiting job once its rank is gone."""
    gpus = machine_gpus()
    first = holding(job, "a", "--gpus", "auto:1")
    try:
        res = run(job, "b", "--gpus", f"auto:{len(gpus)}")
        assert res.returncode == 69, res.stderr[-3000:]
        assert f"job {job.id}-a, user root, unit " in res.stderr, res.stderr
        pid = int(re.findall(rf"job {re.escape(job.id)}-a, .*?pid (\d+)", res.stderr)[0])
        job.box.run(["kill", "-KILL", str(pid)], check=True)
        res = run(job, "c", "--gpus", f"auto:{len(gpus)}", "--wait-for-gpus")
        assert res.returncode == 0, res.stderr[-3000:]
        seen = json.loads((job.dir / "c" / "rank0.json").read_text())
        assert seen["cuda_error"] is None, seen
        finding(f"auto:{len(gpus)} waited for a SIGKILLed watcher's rank and ran on {seen}")
    finally:
        stop(job, first, "a")


@pytest.mark.gpu(needs=("pystemd",))
def test_the_gate_refuses_a_gpu_another_process_uses(job: Job) -> None:
    """A job on GPU 0 while another job holds memory there: refused in one line naming the
    GPU and the pid; --allow-busy-gpus starts it."""
    gpus = machine_gpus()
    first = holding(job, "a", "--gpus", "0")
    try:
        res = run(job, "b", "--gpus", "0")
        assert res.returncode == 69, res.stderr[-3000:]
        line = f"GPU {gpus[0].index} ({gpus[0].bus_id}) is not fit for the job: another process"
        assert line in res.stderr, res.stderr
        res = run(job, "c", "--gpus", "0", "--allow-busy-gpus")
        assert res.returncode == 0, res.stderr[-3000:]
    finally:
        stop(job, first, "a")


@pytest.mark.gpu(needs=("pystemd",))
def test_accounting_in_the_report_and_the_record(job: Job, finding: Callable[[str], None]) -> None:
    """The report's GPU use line and `gpulaunch list --all --json`'s gpu_use of the job."""
    res = run(job, "a", "--gpus", "0")
    assert res.returncode == 0, res.stderr[-3000:]
    assert "GPU use: " in res.stderr and "GPU-seconds" in res.stderr, res.stderr
    listed = job.box.run([GPULAUNCH, "list", "--all", "--json"], capture_output=True, text=True)
    views = [v for v in json.loads(listed.stdout) if v["job"] == f"{job.id}-a"]
    assert len(views) == 1, listed.stdout[-3000:]
    use = views[0]["gpu_use"]
    assert use["gpu_seconds"] > 0 and use["ranks"][0]["gpu"] == 0, use
    finding(f"gpu_use of a 256 MiB probe: {use} (peak/utilisation need nvidia-smi -am 1)")
    assert Path(GPULAUNCH).exists()
