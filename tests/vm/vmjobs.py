"""Running gpulaunch jobs in the VM lab: as root or as an SSH user, with plain-Python ranks."""

from __future__ import annotations

import json
import shlex
import subprocess
import uuid
from dataclasses import dataclass
from typing import Any

from gpulaunch.jobapi.record import MESSAGE_ID
from sdbox.vm import Machine

RANK = "/src/tests/vm/scripts/vmrank.py"
JOB_TIMEOUT = 600.0  # TCG: gpulaunch and each rank take seconds to start


@dataclass
class VmJob:
    """One job in the VM: its id, its user and its output directory there."""

    vm: Machine
    user: str
    id: str

    @property
    def dir(self) -> str:
        return f"/var/tmp/vmt/{self.id}"

    def run(self, line: str, timeout: float = JOB_TIMEOUT) -> subprocess.CompletedProcess[str]:
        """A shell line as the job's user over SSH (a real login)."""
        return self.vm.run(line, user=self.user, timeout=timeout)

    def start(
        self, *options: str, script_args: tuple[str, ...] = (), timeout: float = JOB_TIMEOUT
    ) -> subprocess.CompletedProcess[str]:
        """`gpulaunch start --job ID OPTIONS vmrank.py --dir DIR SCRIPT_ARGS`, to its end."""
        argv = ["gpulaunch", "start", "--job", self.id, *options, RANK, "--dir", self.dir,
                *script_args]  # fmt: skip
        return self.run(shlex.join(argv) + " 2>&1", timeout=timeout)

    def rank(self, n: int) -> dict[str, Any]:
        """What rank n wrote (`rank<n>.json`)."""
        out = self.run(f"cat {self.dir}/rank{n}.json")
        assert out.returncode == 0, out
        data: dict[str, Any] = json.loads(out.stdout)
        return data

    def status_json(self) -> dict[str, Any]:
        out = self.run(f"gpulaunch status --json {self.id}")
        assert out.returncode == 0, out
        data: dict[str, Any] = json.loads(out.stdout)
        return data

    def record(self) -> dict[str, Any]:
        """The job's one journal record (read as root: a user's go to the system journal)."""
        out = self.vm.run(
            f"journalctl -o json --all MESSAGE_ID={MESSAGE_ID} GPULAUNCH_JOB={self.id}",
            check=True,
        )
        entries = [json.loads(line) for line in out.stdout.splitlines()]
        assert len(entries) == 1, entries
        return entries[0]


def new_job(vm: Machine, user: str, label: str) -> VmJob:
    job = VmJob(vm, user, f"{label}-{uuid.uuid4().hex[:6]}")
    vm.run("mkdir -p -m 1777 /var/tmp/vmt", check=True)
    vm.run(f"mkdir {job.dir}", user=user, check=True)
    return job


def wait_for(vm: Machine, condition: str, what: str, seconds: int = 300) -> None:
    """Wait in the VM (one SSH command) until the shell condition holds."""
    res = vm.run(
        f"for i in $(seq {seconds * 5}); do if {condition}; then exit 0; fi; sleep 0.2; done;"
        " exit 1",
        timeout=seconds + 60,
    )
    assert res.returncode == 0, f"timed out waiting for {what}"
