"""The supervisor seam (gpulaunch/supervisor/__init__.py): a supervisor is known by what
it can do (`Capabilities`), never by its name, and every call of it has a caller."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from gpulaunch.model import Manager
from gpulaunch.supervisor import Capabilities, Supervisor
from gpulaunch.supervisor.direct import CgroupSupervisor, ProcessGroupSupervisor
from gpulaunch.supervisor.systemd import SystemdSupervisor
from gpulaunch.system import cgroupchecks, checks
from gpulaunch.system.findings import Machine

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "gpulaunch"
SUPERVISORS = (SystemdSupervisor, CgroupSupervisor, ProcessGroupSupervisor)


def test_each_supervisor_says_what_it_can_do() -> None:
    assert SystemdSupervisor.can == Capabilities(
        makes_units=True, publishes_on_bus=True, needs_keeper=False, manager_limits=True
    )
    direct = Capabilities(
        makes_units=False, publishes_on_bus=False, needs_keeper=True, manager_limits=False
    )
    assert CgroupSupervisor.can == direct and ProcessGroupSupervisor.can == direct


def _outside_the_seam() -> list[Path]:
    return [p for p in PACKAGE.rglob("*.py") if (PACKAGE / "supervisor") not in p.parents]


def test_no_code_outside_the_seam_asks_a_supervisor_its_name() -> None:
    """`name` is for users to read; what a caller needs to know is in `can`."""
    names = {cls.name for cls in SUPERVISORS}
    found = []
    for path in _outside_the_seam():
        text = path.read_text()
        for node in ast.walk(ast.parse(text)):
            if not isinstance(node, ast.Compare):
                continue
            sides = [node.left, *node.comparators]
            named = any(isinstance(s, ast.Constant) and s.value in names for s in sides)
            code = ast.get_source_segment(text, node) or ""
            if named and ("supervisor" in code or ".name" in code):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {code}")
    assert found == []


@pytest.mark.parametrize(
    "method",
    sorted(
        name
        for name, value in vars(Supervisor).items()
        if callable(value) and not name.startswith("_")
    ),
)
def test_every_call_of_the_seam_has_a_caller(method: str) -> None:
    """A method of the interface that nothing outside supervisor/ calls is dead weight
    every new supervisor must still write (stop_ranks was one)."""
    callers = [p for p in _outside_the_seam() if f".{method}(" in p.read_text()]
    assert callers, f"Supervisor.{method} has no caller outside gpulaunch/supervisor/"


def test_the_doctor_shows_the_limits_of_the_supervisor_a_job_gets(tmp_path: Path) -> None:
    """The cgroups rows follow the chosen verdict's own rows, not its name."""
    machine = Machine(manager=Manager.SYSTEM, uid=0, root=tmp_path, env={})
    assert checks.systemd_supervisor(machine, None).limits is cgroupchecks.cgroups
    assert checks.direct_supervisor(machine, None).limits is cgroupchecks.own_cgroups
