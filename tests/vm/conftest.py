"""The VM lab's tests (marker `vm`): a real Debian 12 booted once per session.

The `vm` fixture builds the cached image if it is missing (minutes, once per machine),
boots a pristine VM with this checkout at /src, installs gpulaunch's D-Bus policy
(`gpulaunch setup`) and yields a `sdbox.vm.Machine`: `vm.run(CMD, user=...)` runs CMD
over a real SSH login (root, alice, bob). A VM that cannot be built or booted raises
VMError: the tests error, they never skip.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from sdbox.vm import Machine

REPO = Path(__file__).resolve().parents[2]
VM_TIMES = pytest.StashKey[dict[str, float]]()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(item.path).parents:
            item.add_marker(pytest.mark.vm)


@pytest.fixture(scope="session")
def vm(request: pytest.FixtureRequest) -> Iterator[Machine]:
    """A booted VM for the whole session (see the module's docstring)."""
    times = request.config.stash.setdefault(VM_TIMES, {})
    with Machine(checkout=REPO) as machine:
        times["boot"] = machine.boot_seconds
        machine.run("gpulaunch setup >/dev/null", check=True)
        yield machine


def pytest_terminal_summary(
    terminalreporter: pytest.TerminalReporter, exitstatus: int, config: pytest.Config
) -> None:
    times = config.stash.get(VM_TIMES, {})
    if "boot" in times:
        terminalreporter.write_line(f"sdbox vm: boot {times['boot']:.0f} s")
