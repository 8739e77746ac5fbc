"""The GPU checks (marker `gpu`): where they apply, the systemd they run against, findings.

Where no GPU (or no CUDA torch, or no pystemd) is found, the checks that need it are
deselected and the summary says why (tests/gpu/gate.py); nothing here skips.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import sys
from collections.abc import Callable, Generator, Iterator
from pathlib import Path

import pytest

from sdbox import Box, HostSystemd, host_systemd_running
from tests.gpu import findings, gate, nvsmi
from tests.gpu.gate import pytest_collection_modifyitems, pytest_terminal_summary  # noqa: F401
from tests.integration.conftest import box_files
from tests.integration.jobs import REPO, Job, new_job

SYSTEMD = pytest.StashKey[str]()


@pytest.fixture(scope="session")
def box(request: pytest.FixtureRequest) -> Iterator[Box | HostSystemd]:
    """The host's systemd, else a box binding the repository (it binds /dev/nvidia*)."""
    if host_systemd_running():
        request.config.stash[SYSTEMD] = "the host's (PID 1)"
        yield HostSystemd()
        return
    with Box(binds=[REPO], files=box_files()) as booted:
        request.config.stash[SYSTEMD] = f"the sdbox box (booted in {booted.boot_seconds:.1f} s)"
        yield booted


@pytest.fixture
def job(box: Box | HostSystemd, request: pytest.FixtureRequest) -> Iterator[Job]:
    """A unique job id and directory; the job's slice is stopped on teardown."""
    j = new_job(box, "gpu-" + request.node.name.split("[")[0].removeprefix("test_")[:20])
    yield j
    j.stop()
    shutil.rmtree(j.dir, ignore_errors=True)


@pytest.fixture
def finding(request: pytest.FixtureRequest) -> Callable[[str], None]:
    """Record a figure for this check; it goes to the findings page (and the terminal)."""

    def add(text: str) -> None:
        print(f"finding: {text}")
        figures = findings.session(request.config)["figures"]
        figures.setdefault(request.node.nodeid, []).append(text)

    return add


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report: pytest.TestReport = yield
    if item.get_closest_marker("gpu") is not None and isinstance(item, pytest.Function):
        findings.record_outcome(item.config, report, item.function.__doc__ or "")
    return report


def machine(config: pytest.Config) -> dict[str, str]:
    """What the findings page says about the machine."""
    info = {
        "kernel": platform.release(),
        "cpus": str(os.cpu_count()),
        "python": sys.version.split()[0],
        "systemd": config.stash.get(SYSTEMD, "not started (no check needed it)"),
        "pystemd": gate.probe_pystemd() or "importable",
    }
    why = gate.probed(config, "gpu")
    if why is not None:
        info["gpu"] = f"none ({why})"
        return info
    try:
        info["gpus"] = "; ".join(nvsmi.run(nvsmi.DRIVER_QUERY).strip().splitlines())
    except nvsmi.NvidiaSmiError as exc:
        info["gpus"] = f"nvidia-smi failed: {exc}"
    info["torch"], no_cuda = gate.torch_summary()
    info["cuda torch"] = "no: " + no_cuda if no_cuda else "yes"
    devices = Path("/proc/devices").read_text()
    info["nvidia-uvm loaded at the end"] = "yes" if "nvidia-uvm" in devices else "no"
    return info


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    target = os.environ.get("GPULAUNCH_GPU_FINDINGS")
    if not target:
        return
    data = findings.session(session.config)
    data["machine"] = machine(session.config)
    data["not_applicable"] = gate.not_applicable(session.config)
    Path(target).write_text(json.dumps(data, indent=1))
