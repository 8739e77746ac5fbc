"""The VM lab with podman and the example image, for scenario 11 (bench/scenarios/pod_restart.py).

Booted once per bench run: gpulaunch's .deb built here (scripts/build-deb.sh, as the tests
do), a pristine VM (sdbox/vm, this checkout at /src), the .deb copied in and
examples/Containerfile built by podman from the base image the lab imports (no network in
the VM, so `--build-arg TORCH=`: no torch in the image), then one untimed container run
that also says whether the image's Python can import torch. tests/vm/podman.py builds the
same image the same way for the tests (a pytest fixture there, so not shared).
"""

from __future__ import annotations

import shlex
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

from sdbox.vm import Machine

REPO = Path(__file__).resolve().parents[1]
BASE = "localhost/sdbox-debian:12"  # sdbox/vm/configure.sh imports it into podman's store
TAG = "localhost/gpulaunch-example:bench"
CONTEXT = "/var/tmp/glimage"  # in the VM: the build context as the Containerfile wants it
RANK_PYTHON = "/usr/lib/gpulaunch/bin/python"  # what the package runs ranks with
BUILD_CAP_S = 1800.0


class LabError(Exception):
    """The lab could not be set up: the scenario cannot run (one line)."""


class PodLab:
    """A booted VM with the example image built; a context manager."""

    def __init__(self, say: Callable[[str], None], cpus: int = 2) -> None:
        self.say = say
        self.machine = Machine(checkout=REPO, cpus=cpus)
        self.facts: dict[str, Any] = {}
        self._tmp: tempfile.TemporaryDirectory[str] | None = None

    def __enter__(self) -> PodLab:
        try:
            self._tmp = tempfile.TemporaryDirectory(dir="/var/tmp", prefix="bench-pod-")
            deb = self._deb(Path(self._tmp.name))
            self.say("pod restart: booting the VM lab")
            self.machine.start()
            self.facts["VM"] = (
                f"{self.machine.cpus} CPUs (qemu -smp {self.machine.cpus}), "
                f"{self.machine.memory_mib} MiB, accelerator {self.machine.accel}, "
                f"booted in {self.machine.boot_seconds:.0f} s"
            )
            self._image(deb)
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        self.machine.stop()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    @property
    def qemu_pid(self) -> int | None:
        try:
            assert self.machine.state is not None
            return int((self.machine.state / "qemu.pid").read_text())
        except (AssertionError, OSError, ValueError):
            return None

    def sh(self, script: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
        """A shell script run as root in the VM over the shared SSH login."""
        return self.machine.run(script, timeout=timeout)

    def _deb(self, dest: Path) -> Path:
        self.say("pod restart: building gpulaunch's .deb (scripts/build-deb.sh)")
        done = subprocess.run(
            ["bash", str(REPO / "scripts" / "build-deb.sh"), str(dest)],
            capture_output=True, text=True, timeout=900, check=False,
        )  # fmt: skip
        debs = sorted(dest.glob("gpulaunch_*.deb"))
        if done.returncode != 0 or not debs:
            raise LabError(f"scripts/build-deb.sh failed: {done.stderr.strip()[-600:]}")
        return debs[0]

    def _image(self, deb: Path) -> None:
        self.say("pod restart: podman build of examples/Containerfile in the VM (minutes)")
        self.sh(f"rm -rf {CONTEXT} && mkdir -p {CONTEXT}/dist && cp -r /src/examples {CONTEXT}/")
        self.machine.copy(deb, f"{CONTEXT}/dist/{deb.name}")
        started = time.monotonic()
        build = self.sh(
            f"cd {CONTEXT} && podman build --network=host --build-arg BASE={BASE}"
            f" --build-arg TORCH= -f examples/Containerfile -t {TAG} . 2>&1",
            timeout=BUILD_CAP_S,
        )
        if build.returncode != 0:
            raise LabError(f"podman build failed: {build.stdout.strip()[-600:]}")
        self.facts["image"] = (
            f"{TAG}: examples/Containerfile FROM {BASE}, gpulaunch from its .deb, built in the"
            f" VM in {time.monotonic() - started:.0f} s"
        )
        # Untimed: brings the image's files into the page cache; and is there torch?
        probe = self.sh(
            f"podman --version; podman run --rm --network host {TAG} sh -c "
            + shlex.quote(
                f"gpulaunch --version >/dev/null; {RANK_PYTHON} -c 'import torch' 2>/dev/null"
                " && echo TORCH yes || echo TORCH no"
            )
        )
        lines = probe.stdout.split("\n")
        self.facts["podman"] = lines[0].strip() if lines else "unknown"
        self.facts["torch in the image"] = "TORCH yes" in probe.stdout
        if "TORCH" not in probe.stdout:
            raise LabError(f"a container of {TAG} does not run: {probe.stdout[-600:]}")
