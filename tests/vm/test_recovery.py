"""An OOM kill under the default restart policy (issue 25, item 3; gpulaunch/recovery/), in a
machine whose memory controller enforces --memory-max: the job ends at once with the rank's
status, though --max-restarts would allow two more attempts, and says why."""

from __future__ import annotations

from sdbox.vm import Machine
from tests.vm.vmjobs import new_job


def test_an_oom_kill_is_not_restarted_by_default(vm: Machine) -> None:
    job = new_job(vm, "root", "oomrestart")
    res = job.start(
        "--nproc", "2", "--memory-max", "150M", "--max-restarts", "2",
        script_args=("--hog-rank", "1", "--hog-mb", "400"),
    )  # fmt: skip
    out = res.stdout
    assert res.returncode == 137, out  # the OOM-killed rank's status, not restarted
    assert "rank 1 killed by the OOM killer at" in out, out
    assert "not restarting: oom is not in --restart-on (exit,hang,node,signal)" in out, out
    assert "restarting all ranks" not in out, out
    assert "GPULAUNCH_RESTARTS" not in job.record()  # recorded only when there were some
