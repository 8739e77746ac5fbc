"""--cpus-per-rank in a machine with the cpuset controller: as root each rank, its
multiprocessing worker and a setsid'd daemon it leaves behind stay on the rank's own CPU
(its scope's cpuset.cpus.effective). An SSH user's manager is delegated cpu memory pids,
not cpuset (systemd's default): not enforced, and the start says so. Either way the
daemon goes with the job."""

from __future__ import annotations

import json
import shlex

import pytest

from sdbox.vm import Machine
from tests.vm.vmjobs import new_job


@pytest.mark.parametrize("user", ["root", "alice"])
def test_cpus_per_rank_confines_every_process_of_the_rank(vm: Machine, user: str) -> None:
    job = new_job(vm, user, "cpus")
    res = job.start("--nproc", "2", "--cpus-per-rank", "1", script_args=("--spawn",))
    assert res.returncode == 0, res.stdout
    enforced = user == "root"
    said = "--cpus-per-rank/--cpu-bind is not enforced: user jobs lack the cpuset controller"
    assert (said in res.stdout) != enforced, res.stdout
    seen = set()
    for n in (0, 1):
        rank = job.rank(n)
        daemon = json.loads(job.run(f"cat {job.dir}/rank{n}.daemon.json").stdout)
        cpus = rank["cpus"]
        assert cpus in ({"0", "1"} if enforced else {"0-1"}), rank
        assert rank["cpuset"] == (cpus if enforced else None), rank  # its scope's cpuset
        assert rank["worker"]["cpus"] == cpus, rank
        assert daemon["cpus"] == cpus, daemon
        seen.add(cpus)
        gone = job.run(f"kill -0 {daemon['pid']}")
        assert gone.returncode != 0, f"rank {n}'s daemon outlived the job"
    assert seen == ({"0", "1"} if enforced else {"0-1"})  # a CPU of its own each, as root


NUMA_MACHINE = (
    "import sys; sys.path.insert(0, '/src')\n"
    "from pathlib import Path\n"
    "from tests.fake_machine import FakeGpu, write_fake_machine\n"
    "write_fake_machine(Path(sys.argv[1]), [FakeGpu('0000:1b:00.0', 0, 'GPU-aaaa', 0),"
    " FakeGpu('0000:3d:00.0', 1, 'GPU-bbbb', 1)], online='0-1', nodes={0: '0', 1: '1'})\n"
)


def test_cpu_bind_numa_confines_each_rank_to_its_gpus_node(vm: Machine) -> None:
    """Two fake GPUs on NUMA nodes 0 (CPU 0) and 1 (CPU 1): as root each rank and its
    helpers run on its GPU's node only."""
    job = new_job(vm, "root", "numa")
    machine = f"{job.dir}/machine"
    job.run(f"/opt/gpulaunch-venv/bin/python -c {shlex.quote(NUMA_MACHINE)} {machine}")
    res = job.start(
        "--nproc", "2", "--gpus", "0,1", "--cpu-bind", "numa", "--machine-root", machine,
        script_args=("--spawn",),
    )  # fmt: skip
    assert res.returncode == 0, res.stdout
    for n in (0, 1):
        rank = job.rank(n)
        daemon = json.loads(job.run(f"cat {job.dir}/rank{n}.daemon.json").stdout)
        assert rank["cpus"] == rank["cpuset"] == str(n), rank
        assert rank["worker"]["cpus"] == daemon["cpus"] == str(n), (rank, daemon)
