"""One home per fact (issue 24 point 4): the shared parsers every feature uses."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpulaunch.base.cgroup import cgroup_of, proc_cgroup, unified_path
from gpulaunch.frontend import need

V1_AND_V2 = "12:cpu,cpuacct:/old\n1:name=systemd:/user.slice\n0::/user.slice/u.scope\n"


@pytest.mark.parametrize(
    ("text", "path"),
    [
        (V1_AND_V2, "/user.slice/u.scope"),
        ("0::/\n", "/"),
        ("0::/../outside\n", "/../outside"),
        ("1:name=systemd:/a\n", None),  # cgroup v1 only
        ("", None),
    ],
)
def test_the_one_parser_of_proc_pid_cgroup(text: str, path: str | None, tmp_path: Path) -> None:
    assert unified_path(text) == path
    (tmp_path / "42").mkdir()
    (tmp_path / "42" / "cgroup").write_text(text)
    assert proc_cgroup(42, tmp_path) == path
    assert need.own_cgroup(tmp_path / "42" / "cgroup") == path
    root = Path("/sys/fs/cgroup")
    inside = path is not None and "/.." not in path
    assert cgroup_of(42, tmp_path, root) == (root / path.lstrip("/") if inside else None)


def test_a_process_that_is_gone_has_no_cgroup(tmp_path: Path) -> None:
    assert proc_cgroup(42, tmp_path) is None and cgroup_of(42, tmp_path) is None
