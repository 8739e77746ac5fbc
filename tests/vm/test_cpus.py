"""--cpus-per-rank in a machine with the cpuset controller: each rank, its multiprocessing
worker and a setsid'd daemon it leaves behind stay on the rank's own CPU, as root and as
an SSH user; the daemon goes with the job."""

from __future__ import annotations

import json

import pytest

from sdbox.vm import Machine
from tests.vm.vmjobs import new_job


@pytest.mark.parametrize("user", ["root", "alice"])
def test_cpus_per_rank_confines_every_process_of_the_rank(vm: Machine, user: str) -> None:
    job = new_job(vm, user, "cpus")
    res = job.start("--nproc", "2", "--cpus-per-rank", "1", script_args=("--spawn",))
    assert res.returncode == 0, res.stdout
    seen = set()
    for n in (0, 1):
        rank = job.rank(n)
        daemon = json.loads(job.run(f"cat {job.dir}/rank{n}.daemon.json").stdout)
        cpus = rank["cpus"]
        assert cpus in {"0", "1"}, rank
        assert rank["cpuset"] == cpus, rank  # cpuset.cpus.effective of its scope
        assert rank["worker"]["cpus"] == cpus, rank
        assert daemon["cpus"] == cpus, daemon
        seen.add(cpus)
        gone = job.run(f"kill -0 {daemon['pid']}")
        assert gone.returncode != 0, f"rank {n}'s daemon outlived the job"
    assert seen == {"0", "1"}  # a CPU of its own each
