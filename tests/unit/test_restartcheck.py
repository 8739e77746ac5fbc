"""The supervisors' seam for a check before each restart's ranks run (the GPU health gate):
gpulaunch/supervisor/restartcheck.py. End to end: tests/unit/test_gpu_health.py's restart."""

from __future__ import annotations

import pytest

from gpulaunch.errors import UnavailableError
from gpulaunch.supervisor.direct import CgroupSupervisor, ProcessGroupSupervisor
from gpulaunch.supervisor.restartcheck import RestartCheck
from gpulaunch.supervisor.systemd import SystemdSupervisor


def test_only_the_first_rank_placed_after_a_renewal_is_checked() -> None:
    seam = RestartCheck()
    checks: list[str] = []
    seam.restart_check = lambda: checks.append("checked")
    seam._rank_placed()  # the first attempt: checked before the job started
    assert checks == []
    seam._gang_renewed()
    seam._rank_placed()
    seam._rank_placed()
    assert checks == ["checked"]
    seam._gang_renewed()
    seam._rank_placed()
    assert checks == ["checked", "checked"]


def test_the_checks_error_reaches_the_placer_and_no_check_is_no_op() -> None:
    seam = RestartCheck()
    seam._gang_renewed()
    seam._rank_placed()  # nothing set: nothing to do

    def unfit() -> None:
        raise UnavailableError("GPU 1 is not fit for the job: XID 79 reported")

    seam.restart_check = unfit
    seam._gang_renewed()
    with pytest.raises(UnavailableError, match="XID 79"):
        seam._rank_placed()
    seam._rank_placed()  # once per renewal


@pytest.mark.parametrize("cls", [SystemdSupervisor, CgroupSupervisor, ProcessGroupSupervisor])
def test_every_supervisor_offers_the_seam(cls: type) -> None:
    assert issubclass(cls, RestartCheck)
    assert cls.restart_check is None  # none unless start.py hands one in
