"""The launcher never imports torch (a multi-node job's peer process does, by itself)."""

from __future__ import annotations

import pkgutil
import subprocess
import sys

import gpulaunch

# Lightning's strategy imports Lightning (and torch): only a training script imports it.
LIGHTNING = "gpulaunch.integrations.lightning"
LIGHTNING_PROGRESS = "gpulaunch.integrations.progress"  # the progress callback: the same


def test_no_gpulaunch_module_but_the_peer_imports_torch() -> None:
    modules = [
        m.name
        for m in pkgutil.walk_packages(gpulaunch.__path__, "gpulaunch.")
        if m.name
        not in ("gpulaunch.multinode.peer", "gpulaunch.__main__", LIGHTNING, LIGHTNING_PROGRESS)
    ]
    assert "gpulaunch.watcher.loop" in modules and "gpulaunch.multinode.peerlink" in modules
    code = (
        "import importlib, sys\n"
        f"for name in {modules!r}:\n"
        "    importlib.import_module(name)\n"
        "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"
