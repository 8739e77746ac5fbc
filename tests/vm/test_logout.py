"""An SSH user logs out while the job runs (docs/environments.md, "Logging out"): the
front end is in the login's session scope, the watcher a service of the user's manager
tied to the front end's bus name. `loginctl terminate-session` ends the front end:
systemd stops the watcher's service, which stops the ranks and records the job as
stopped. `loginctl terminate-user` stops the user's manager with everything in it; the
watcher, stopped with it, still records the job. Either way nothing of the job is left.
"""

from __future__ import annotations

import json
import shlex

import pytest

from sdbox.vm import Machine
from tests.vm.vmjobs import RANK, new_job, wait_for


@pytest.mark.parametrize("how", ["terminate-session", "terminate-user"])
def test_logout_while_a_job_runs(vm: Machine, how: str) -> None:
    job = new_job(vm, "bob", how.split("-")[1])
    argv = ["gpulaunch", "start", "--job", job.id, "--nproc", "2", RANK, "--dir", job.dir,
            "--sleep", "600"]  # fmt: skip
    login = vm.popen(shlex.join(argv), user="bob", fresh=True)  # a login of its own
    try:
        wait_for(vm, f"test -e {job.dir}/rank0.json -a -e {job.dir}/rank1.json", "the ranks")
        pids = [job.rank(n)["pid"] for n in (0, 1)]
        front = vm.run(f"pgrep -u bob -o -f {shlex.quote('gpulaunch start --job ' + job.id)}")
        session = vm.run(f"ps -o lsession= -p {front.stdout.strip()}").stdout.strip()
        assert session, front
        target = session if how == "terminate-session" else "bob"
        vm.run(f"loginctl {how} {target}", check=True)
        login.wait(timeout=300)
        # [.]: the pattern must not match the waiting shell's own command line
        ranks = shlex.quote(f"vmrank[.]py --dir {job.dir}")
        wait_for(vm, f"! pgrep -f {ranks} >/dev/null", "the ranks' end")
        for pid in pids:
            assert vm.run(f"kill -0 {pid}").returncode != 0, f"rank {pid} outlived the logout"
        units = vm.run(f"systemctl --user -M bob@ list-units --no-legend 'gpulaunch-{job.id}*'")
        assert job.id not in units.stdout, units.stdout
        wait_for(vm, f"journalctl -q --all GPULAUNCH_JOB={job.id} | grep -q .", "the record")
        record = job.record()
        assert record["GPULAUNCH_STATE"] == "stopped", record
        recorded = json.loads(record["GPULAUNCH_RANKS"])
        assert all(r["stopped_by_watcher"] for r in recorded), recorded
    finally:
        if login.poll() is None:
            login.kill()
