"""Which limits a job's manager cannot enforce (gpulaunch/resources/controllers.py), on
fake cgroup trees: a user manager without cpuset (systemd's default delegation), a
system manager with every controller, a machine without cgroup v2."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from gpulaunch.model import Manager
from gpulaunch.resources.controllers import unenforced
from tests.unit.fakes import make_job


def tree(root: Path, where: str, controllers: str) -> Path:
    (root / where).mkdir(parents=True, exist_ok=True)
    (root / where / "cgroup.controllers").write_text(controllers + "\n")
    return root


def test_user_manager_without_cpuset_says_cpus_are_not_enforced(tmp_path: Path) -> None:
    root = tree(tmp_path, "user.slice/user-1001.slice/user@1001.service", "cpu memory pids")
    spec, _ = make_job([["true"], ["true"]])
    ranks = tuple(replace(r, cpus=str(r.rank)) for r in spec.ranks)
    spec = replace(spec, manager=Manager.USER, ranks=ranks, memory_max="1G")
    lines = unenforced(spec, root, uid=1001)
    assert lines == [
        "--cpus-per-rank/--cpu-bind is not enforced: user jobs lack the cpuset controller "
        "here (delegate it (Delegate= in a drop-in for user@.service) or run as root)"
    ]


def test_system_manager_with_every_controller_says_nothing(tmp_path: Path) -> None:
    root = tree(tmp_path, "", "cpuset cpu io memory pids")
    spec, _ = make_job([["true"]])
    spec = replace(
        spec, memory_max="1G", job_memory_max="2G", ranks=(replace(spec.ranks[0], cpus="0"),)
    )
    assert unenforced(spec, root, uid=0) == []


def test_no_memory_controller_names_both_memory_options(tmp_path: Path) -> None:
    root = tree(tmp_path, "", "cpu pids")
    spec, _ = make_job([["true"]])
    spec = replace(spec, memory_max="1G", job_memory_max="2G")
    assert [line.split(" is ")[0] for line in unenforced(spec, root, uid=0)] == [
        "--memory-max",
        "--job-memory-max",
    ]


def test_nothing_asked_or_nothing_to_tell(tmp_path: Path) -> None:
    spec, _ = make_job([["true"]])
    assert unenforced(spec, tree(tmp_path, "", "cpu"), uid=0) == []  # no limit asked
    limited = replace(spec, memory_max="1G")
    assert unenforced(limited, tmp_path / "absent", uid=0) == []  # no cgroup v2: doctor says
