"""The example image (examples/Containerfile) built with podman in the VM lab, once a session,
and jobs run in it as the image means them to: gpulaunch the container's PID 1. Used by
tests/vm/test_image.py and tests/vm/test_termination.py."""

from __future__ import annotations

import re
import shlex
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from sdbox.vm import Machine

REPO = Path(__file__).resolve().parents[2]
BASE = "localhost/sdbox-debian:12"  # sdbox/vm/configure.sh
TAG = "localhost/gpulaunch-example:test"
CONTEXT = "/var/tmp/glimage"  # the repository's top level as the Containerfile wants it
JOB_DIR = "/var/tmp/glimage-job"
TRAIN = """\
import os, signal, sys, time
rank = int(os.environ["RANK"])
with open("/proc/1/cmdline", "rb") as f:
    init = f.read().replace(b"\\0", b" ").decode().strip()
print(f"rank {rank} of {os.environ['WORLD_SIZE']}: {sys.executable}; pid 1: {init}", flush=True)
mode = sys.argv[1] if len(sys.argv) > 1 else ""
if mode == "--fail":
    if rank == 1:
        sys.exit(3)
    time.sleep(600)  # until the gang is stopped
if mode == "--oom":
    hog = []
    while rank == 1:  # until the container's memory limit's OOM killer ends it
        hog.append(bytearray(8 << 20))
    time.sleep(600)
if mode == "--preempt":  # saves for a second on the notice, then ends
    signal.signal(signal.SIGTERM, lambda *_: (time.sleep(1), sys.exit(0)))
    time.sleep(600)
"""


@pytest.fixture(scope="session")
def deb() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(dir="/var/tmp", prefix="gpulaunch-deb-") as tmp:
        res = subprocess.run(
            ["bash", str(REPO / "scripts" / "build-deb.sh"), tmp],
            capture_output=True, text=True, timeout=900,
        )  # fmt: skip
        assert res.returncode == 0, res.stderr[-3000:]
        (built,) = Path(tmp).glob("gpulaunch_*.deb")
        yield built


@pytest.fixture(scope="session")
def image(vm: Machine, deb: Path) -> Iterator[str]:
    """The example image, built by podman in the VM from examples/Containerfile."""
    podman = vm.run("command -v podman")
    assert podman.returncode == 0, (
        "podman is not in the VM image: sdbox/vm/image.py's APT_PACKAGES must list it"
    )
    base = vm.run(f"podman image exists {BASE}")
    assert base.returncode == 0, (
        f"no {BASE} in the VM's podman store: sdbox/vm/configure.sh imports it when the"
        " image is built (a VM image from before that: its recipe hash changed, rebuild it)"
    )
    vm.run(
        f"rm -rf {CONTEXT} {JOB_DIR} && mkdir -p {CONTEXT}/dist {JOB_DIR}"
        f" && cp -r /src/examples {CONTEXT}/",
        check=True,
    )
    vm.copy(deb, f"{CONTEXT}/dist/{deb.name}")
    vm.write(f"{JOB_DIR}/train.py", TRAIN)
    build = vm.run(
        f"cd {CONTEXT} && podman build --network=host --build-arg BASE={BASE}"
        f" --build-arg TORCH= -f examples/Containerfile -t {TAG} . 2>&1",
        timeout=1200,
    )
    assert build.returncode == 0, build.stdout[-4000:]
    assert "gpulaunch 0.1.0" in build.stdout, build.stdout[-4000:]  # the recipe's own check
    yield TAG
    vm.run(f"podman rmi -f {TAG}")


def run_job(
    vm: Machine,
    image: str,
    job: str,
    *script_args: str,
    podman: tuple[str, ...] = (),
    options: tuple[str, ...] = (),
) -> tuple[int, str]:
    """`podman run` of a 2-rank job (`podman`: its options; `options`: gpulaunch's)."""
    argv = ["podman", "run", "--rm", "--network", "host", "-v", f"{JOB_DIR}:/srv/job:ro",
            "-w", "/srv/job", *podman, image, "gpulaunch", "start", "--job", job,
            "--nproc", "2", *options, "train.py", *script_args]  # fmt: skip
    res = vm.run(shlex.join(argv) + " 2>&1", timeout=600)
    return res.returncode, res.stdout


def row(out: str, rank: int, unit: str | None = None) -> str:
    """The report's row of a rank, from its exit on: `rank unit pid exit how ...`."""
    name = r"\S+" if unit is None else re.escape(unit)
    found = re.search(rf"^\s+{rank}\s+{name}\s+\d+\s+(\D.*)$", out, re.MULTILINE)
    assert found, out
    return " ".join(found.group(1).split())
