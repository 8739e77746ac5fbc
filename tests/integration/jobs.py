"""Integration-test helpers: run the installed `gpulaunch` in the box, see what systemd sees."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpulaunch.base.names import UnitNames
from gpulaunch.jobapi.record import MESSAGE_ID

REPO = Path(__file__).resolve().parents[2]
GPULAUNCH = str(Path(sys.executable).with_name("gpulaunch"))
RANK_SCRIPT = str(REPO / "tests" / "integration" / "scripts" / "rank.py")
# A directory visible at the same path on the host and in the box (the repo is bound into it),
# one per test session; conftest.py removes it at the end of the session.
SHARED_ROOT = REPO / ".it-tmp"
SHARED = SHARED_ROOT / f"session-{os.getpid()}"
# sh: print `$p STATE` (/proc/PID/stat's third field) if process $p exists in any state,
# a zombie (Z) included: "no zombies" is promised, so a zombie counts as left behind.
STATE_OF_P = 's=$(cut -d" " -f3 /proc/$p/stat 2>/dev/null) && echo "$p $s"'


@dataclass
class Job:
    """A unique job id and a directory its ranks write pid files to."""

    box: Any
    id: str
    dir: Path

    @property
    def names(self) -> UnitNames:
        return UnitNames.for_job(self.id)

    def argv(
        self, *opts: str, script_args: Sequence[str] = (), script: str = RANK_SCRIPT
    ) -> list[str]:
        return [
            GPULAUNCH,
            "start",
            "--job",
            self.id,
            *opts,
            script,
            "--dir",
            str(self.dir),
            *script_args,
        ]

    def run(
        self,
        *opts: str,
        script_args: Sequence[str] = (),
        timeout: float = 120,
        text: bool = True,
        **kw: Any,
    ) -> subprocess.CompletedProcess[Any]:
        return self.box.run(
            self.argv(*opts, script_args=script_args, **kw),
            cwd=str(REPO),
            capture_output=True,
            text=text,
            timeout=timeout,
        )

    def popen(
        self, *opts: str, script_args: Sequence[str] = (), **kw: Any
    ) -> subprocess.Popen[str]:
        return self.box.popen(
            self.argv(*opts, script_args=script_args, **kw),
            cwd=str(REPO),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def units(self) -> list[str]:
        """This job's units that systemd still knows, in any state."""
        out = self.box.run(
            ["systemctl", "list-units", "--all", "--plain", "--no-legend", "gpulaunch-*"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        prefix = f"gpulaunch-{self.names.component}"
        mine = []
        for line in out.splitlines():
            name = line.split()[0] if line.split() else ""
            if name == self.names.job_slice or name.startswith(prefix + "-"):
                mine.append(line.strip())
        return mine

    def show(self, unit: str, prop: str) -> list[str]:
        """A unit property as `systemctl show` reports it, unquoted into its items."""
        out = self.box.run(
            ["systemctl", "show", "--value", "-p", prop, unit],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        return shlex.split(out)

    def pids(self) -> dict[str, int]:
        return {p.stem: int(p.read_text()) for p in self.dir.glob("*.pid") if p.read_text()}

    def alive(self) -> list[str]:
        """Names of recorded processes that still exist in the box; a zombie (state Z: ended
        but never reaped) is left behind too, named `NAME (zombie)`."""
        pids = self.pids()
        if not pids:
            return []
        script = f"for p in {' '.join(map(str, pids.values()))}; do {STATE_OF_P}; done; true"
        out = self.box.run(["sh", "-c", script], capture_output=True, text=True, check=True).stdout
        states = dict(line.split() for line in out.splitlines() if line.strip())
        return [
            name + (" (zombie)" if states[str(pid)] == "Z" else "")
            for name, pid in pids.items()
            if str(pid) in states
        ]

    def wait_file(self, name: str, timeout: float = 60) -> None:
        wait_until(lambda: (self.dir / name).exists(), timeout, f"{name} in {self.dir}")

    def record(self) -> dict[str, Any]:
        """The job's one journal record (asserts there is exactly one), as journalctl gives it."""
        out = self.box.run(
            [
                "journalctl",
                "-o",
                "json",
                "--all",
                f"MESSAGE_ID={MESSAGE_ID}",
                f"GPULAUNCH_JOB={self.id}",
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        entries = [json.loads(line) for line in out.splitlines()]
        assert len(entries) == 1, entries
        return entries[0]

    def stop(self) -> None:
        self.box.run(["systemctl", "stop", self.names.job_slice], capture_output=True)


def new_job(box: Any, label: str) -> Job:
    job_id = f"{label}-{uuid.uuid4().hex[:6]}"
    d = SHARED / job_id
    d.mkdir(parents=True)
    return Job(box=box, id=job_id, dir=d)


def wait_until(pred: Callable[[], bool], timeout: float, what: str) -> float:
    """Wait for a condition in a test (not product code); returns the seconds it took."""
    start = time.monotonic()
    while not pred():
        if time.monotonic() - start > timeout:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)
    return time.monotonic() - start


def assert_clean(job: Job) -> None:
    """Nothing of the job is left: no unit in any state, no recorded process."""
    wait_until(lambda: not job.units(), 5, f"units of {job.id} to go away: {job.units()}")
    # A scope is gone once its cgroup is empty; an orphan that was in it may stay a zombie
    # until its new parent (the manager, a subreaper) reaps it, a moment later: never longer.
    wait_until(lambda: job.alive() == [], 5, "every recorded process gone, zombies too")
    failed = job.box.run(
        ["systemctl", "list-units", "--failed", "--plain", "--no-legend"],
        capture_output=True,
        text=True,
    ).stdout
    assert "gpulaunch" not in failed
