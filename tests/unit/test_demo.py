"""scripts/demo.sh from a clone under /tmp, and its stop at the first failure (issue 22
item 10). The real demo needs torch and minutes; here scripts/setup.sh of the clone is
replaced by one that makes a stand-in .venv/bin/python (it logs where and how it was
called, and fails where told), so what is tested is the script's own logic."""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

FAKE_SETUP = """#!/usr/bin/env bash
mkdir -p .venv/bin
cat > .venv/bin/python <<'SH'
#!/bin/sh
[ "$1" = - ] && exec python3 "$@"   # the demo's own check of the record
echo "$(pwd -P) $*" >> "$DEMO_LOG"
case "$*" in *"$DEMO_FAIL"*) exit "$DEMO_STATUS" ;; esac
exit 0
SH
chmod +x .venv/bin/python
"""


@pytest.fixture
def clone(tmp_path: Path) -> Path:
    """The repository's files in a clone under /tmp (tmp_path), with the stand-in setup."""
    assert str(tmp_path).startswith("/tmp/")
    files = subprocess.run(
        ["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True
    ).stdout.split(b"\0")
    into = tmp_path / "gpulaunch"
    for name in filter(None, files):
        source = REPO / os.fsdecode(name)
        if source.is_file():
            (into / os.fsdecode(name)).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, into / os.fsdecode(name))
    (into / "scripts" / "setup.sh").write_text(FAKE_SETUP)
    return into


@pytest.fixture
def copy() -> Iterator[Path]:
    where = Path(f"/var/tmp/gpulaunch-demo-test-{uuid.uuid4().hex[:8]}")
    yield where
    shutil.rmtree(where, ignore_errors=True)


def demo(clone: Path, copy: Path, fail: str, status: int) -> subprocess.CompletedProcess[str]:
    log = clone.parent / "calls.log"
    env = {
        **os.environ,
        "GPULAUNCH_DEMO_COPY": str(copy),
        "DEMO_LOG": str(log),
        "DEMO_FAIL": fail,
        "DEMO_STATUS": str(status),
    }
    return subprocess.run(
        ["bash", str(clone / "scripts" / "demo.sh")],
        cwd="/",
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def calls(clone: Path) -> list[str]:
    return (clone.parent / "calls.log").read_text().splitlines()


def test_a_clone_under_tmp_runs_a_copy_and_stops_at_part_1(clone: Path, copy: Path) -> None:
    res = demo(clone, copy, fail="demo-ok", status=3)
    assert res.returncode == 1, res.stderr
    assert f"running a copy in {copy}" in res.stderr, res.stderr
    assert "demo: part 1 did not succeed (exit status 3); stopped here" in res.stderr
    assert "== 2/2" not in res.stderr, res.stderr  # it stopped
    (only,) = calls(clone)
    assert only.startswith(f"{copy} -m sdbox run -- .venv/bin/gpulaunch start") and (
        "demo-ok" in only
    )
    assert (copy / "scripts" / "demo.sh").is_file() and not (clone / ".venv").exists()


def test_part_2_without_a_record_is_a_failure_not_cause_none(clone: Path, copy: Path) -> None:
    res = demo(clone, copy, fail="demo-fail", status=2)
    assert res.returncode == 1, res.stderr
    assert "== 2/2" in res.stderr
    assert "part 2 ended with status 2 and left no job record; stopped here" in res.stderr
    assert "cause None" not in res.stderr
    assert [c.split()[0] for c in calls(clone)] == [str(copy), str(copy)]


def test_a_copy_under_tmp_is_refused(clone: Path, tmp_path: Path) -> None:
    res = demo(clone, tmp_path / "copy", fail="none", status=0)
    assert res.returncode == 2 and "choose another place" in res.stderr, res.stderr
    assert not (tmp_path / "copy").exists()
