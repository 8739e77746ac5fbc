"""The report's CPU time and peak memory come from each rank's cgroup where the
controllers are, and agree with a known load within 10 %: a rank that burns 4 s of CPU
and holds 200 MiB, against its own count (process_time, ru_maxrss) at its end."""

from __future__ import annotations

import json

import pytest

from sdbox.vm import Machine
from tests.vm.vmjobs import new_job


@pytest.mark.parametrize("user", ["root", "alice"])
def test_report_usage_from_the_cgroup_matches_the_load(vm: Machine, user: str) -> None:
    job = new_job(vm, user, "usage")
    res = job.start("--nproc", "1", script_args=("--burn-sec", "4", "--hold-mb", "200"))
    assert res.returncode == 0, res.stdout
    assert "cpu: from the unit's cgroup (cpu.stat); peak mem: from the unit's cgroup" in res.stdout
    usage = job.status_json()["ranks"][0]["usage"]
    own = json.loads(job.run(f"cat {job.dir}/rank0.end.json").stdout)
    # the scope also held the rank's log pump, idle here: a little more, never less
    assert own["cpu_sec"] <= usage["cpu_sec"] <= own["cpu_sec"] * 1.1, (usage, own)
    rss = own["maxrss"] * 1024
    assert rss * 0.9 <= usage["peak_memory"] <= rss * 1.1, (usage, own)
    assert usage["peak_memory"] >= 200 << 20, usage
