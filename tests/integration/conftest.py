"""Integration tests run against a real systemd: the host's, or one box per session."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from sdbox import Box, HostSystemd, host_systemd_running
from tests.integration.jobs import SHARED, SHARED_ROOT, Job, new_job

REPO = Path(__file__).resolve().parents[2]
BOX_TIMES = pytest.StashKey[dict[str, float]]()


def box_files() -> dict[str, str]:
    """What setup installs into /etc for gpulaunch, written into a box before it boots."""
    # gpulaunch's D-Bus policy, as gpulaunch setup installs it (tests must not need setup).
    policy = (REPO / "packaging" / "dbus" / "io.gpulaunch.conf").read_text()
    return {"etc/dbus-1/system.d/io.gpulaunch.conf": policy}


@pytest.fixture(scope="session")
def box(request: pytest.FixtureRequest) -> Iterator[Box | HostSystemd]:
    """A running systemd: the host's, else a box binding the repository.

    A box that does not boot raises BoxError, so the tests using it error (never skip).
    """
    if host_systemd_running():
        yield HostSystemd()
        return
    times = request.config.stash.setdefault(BOX_TIMES, {})
    # gpulaunch's D-Bus policy, as gpulaunch setup installs it (tests must not need setup).
    booted = Box(binds=[REPO], files=box_files())
    with booted:
        times["boot"] = booted.boot_seconds
        yield booted
    times["teardown"] = booted.teardown_seconds


@pytest.fixture(scope="session", autouse=True)
def shared_dir() -> Iterator[None]:
    """The session's directory for pid files and outputs, gone when the session ends."""
    yield
    shutil.rmtree(SHARED, ignore_errors=True)
    try:
        SHARED_ROOT.rmdir()  # unless another session in this checkout still uses it
    except OSError:
        pass


def pytest_terminal_summary(
    terminalreporter: pytest.TerminalReporter, exitstatus: int, config: pytest.Config
) -> None:
    times = config.stash.get(BOX_TIMES, {})
    if "boot" in times:
        line = f"sdbox: boot {times['boot']:.2f} s"
        if "teardown" in times:
            line += f", teardown {times['teardown']:.2f} s"
        terminalreporter.write_line(line)


@pytest.fixture
def job(box: Box | HostSystemd, request: pytest.FixtureRequest) -> Iterator[Job]:
    """A unique job id and pid-file directory; the job's slice is stopped on teardown."""
    label = request.node.name.split("[")[0].removeprefix("test_")[:24]
    j = new_job(box, label)
    yield j
    j.stop()
    shutil.rmtree(j.dir, ignore_errors=True)
