"""`gpulaunch doctor` says what `start` does (issue 22 item 8): no systemd answering is
no stop where the direct supervisor runs; an unusable error-file directory is."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpulaunch.model import Manager
from gpulaunch.system import checks, doctor
from gpulaunch.system.findings import Finding, Machine, Status


def test_a_user_without_xdg_runtime_dir_can_run_a_job(tmp_path: Path) -> None:
    m = Machine(manager=Manager.USER, uid=1000, root=tmp_path, env={})
    rows = [
        *checks.supervisors(
            m, [checks.Verdict("systemd", False, "no"), checks.Verdict("direct", True, "pg")]
        ),
        *checks.managers(m, {Manager.USER: checks.GpulaunchError("no user bus")}),
        *checks.user_jobs(m),
    ]
    xdg = next(f for f in rows if f.item == "XDG_RUNTIME_DIR")
    assert xdg.status is Status.WARN
    assert doctor.can_run(rows)


def test_an_unusable_error_file_directory_stops_a_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    (tmp_path / "gpulaunch").symlink_to("/tmp")
    m = Machine(manager=Manager.USER, uid=os.getuid())
    (row,) = checks.runtime_files(m)
    assert row.status is Status.FAIL and "symbolic link" in row.detail
    ok = Finding("supervisor", "a job gets", Status.OK, "direct: pg")
    assert not doctor.can_run([ok, row])
    (tmp_path / "gpulaunch").unlink()
    (row,) = checks.runtime_files(m)
    assert row.status is Status.OK and row.detail == str(tmp_path / "gpulaunch")
