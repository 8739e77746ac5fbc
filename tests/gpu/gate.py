"""Which GPU checks apply on this machine; the others are reported, never silently skipped.

A test marked `gpu` needs an NVIDIA GPU; `@pytest.mark.gpu(needs=("cuda-torch",))` also
needs a torch that can use it, `needs=("pystemd",)` gpulaunch's D-Bus binding (to run
jobs), `needs=("host-pids",)` jobs whose pids are the ones NVML and nvidia-smi report (the
host's systemd, not in a pid namespace below the host's), `needs=("own-pid-namespace",)`
the opposite: a check that cannot compare is not applicable, never "passed". Where a need
is not met, the test is *deselected* at collection (it never runs, so it can neither pass
nor skip) and the terminal summary says why, one line per reason:

    gpu: no NVIDIA GPU here (no /proc/driver/nvidia, NVML: ...) — 9 GPU checks not applicable

The findings file (tests/gpu/findings.py) lists them as "not applicable" with the
reason. With `GPULAUNCH_REQUIRE_GPU=1` (what scripts/test-gpu.sh sets on a GPU machine)
a missing GPU is a usage error (exit 4) instead: there it means the machine is broken.

`GPULAUNCH_GPU_PROC` points the probe at a fake /proc tree and turns NVML off (the gate's
own tests).
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

NEEDS = ("cuda-torch", "pystemd", "host-pids", "own-pid-namespace")
REASONS = pytest.StashKey[dict[str, list[str]]]()  # reason -> test ids not applicable
PROBED = pytest.StashKey[dict[str, str | None]]()  # need -> why not (None: met)


def probe_gpu(proc: Path = Path("/proc"), use_nvml: bool = True) -> str | None:
    """None where an NVIDIA GPU is found, else why not (both sources, one line)."""
    top = proc / "driver/nvidia/gpus"
    if top.is_dir():
        if any(top.iterdir()):
            return None
        where = f"{top} lists no GPU"
    else:
        where = f"no {proc / 'driver/nvidia'}"
    if not use_nvml:
        return f"{where}, NVML not asked"
    try:
        nvml = importlib.import_module("pynvml")
    except ImportError:
        return f"{where}, NVML: pynvml not installed"
    try:
        nvml.nvmlInit()
    except Exception as exc:  # pynvml.NVMLError_LibraryNotFound, _DriverNotLoaded, ...
        return f"{where}, NVML: {exc}"
    try:
        count = int(nvml.nvmlDeviceGetCount())
    except Exception as exc:
        return f"{where}, NVML: {exc}"
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception:
            pass
    return None if count > 0 else f"{where}, NVML: 0 GPUs"


TORCH_PROBE = (
    "import torch\n"
    "print(torch.__version__, torch.version.cuda, torch.cuda.is_available(),"
    " torch.cuda.device_count())\n"
)


def torch_summary(python: str = sys.executable) -> tuple[str, str | None]:
    """(what torch is here, why it cannot use the GPU or None). In a child process, so the
    test process never holds a CUDA context (it would show up in nvidia-smi)."""
    try:
        res = subprocess.run(
            [python, "-c", TORCH_PROBE], capture_output=True, text=True, timeout=180
        )
    except subprocess.TimeoutExpired:
        return "torch (import timed out)", "importing torch took over 180 s"
    if res.returncode != 0:
        last = (res.stderr.strip().splitlines() or ["?"])[-1]
        return "no torch", f"no CUDA torch ({last})"
    version, cuda, available, count = res.stdout.split()
    what = f"torch {version} (CUDA {cuda})"
    if cuda == "None":
        return what, f"no CUDA torch (torch {version} is a CPU build)"
    if available != "True" or int(count) < 1:
        return what, f"no CUDA torch ({what} sees no GPU)"
    return what, None


def probe_pystemd() -> str | None:
    try:
        importlib.import_module("pystemd.dbuslib")
    except ImportError as exc:
        return f"pystemd not installed ({exc}): gpulaunch cannot run jobs"
    return None


def probe_host_pids() -> str | None:
    """None where the jobs' pids are the host's (what NVML reports), else why not."""
    from gpulaunch.resources.sample import nested_pid_namespace
    from sdbox import host_systemd_running

    if not host_systemd_running():
        return "the jobs run in the sdbox box, a pid namespace of its own (systemd is not PID 1)"
    if nested_pid_namespace():
        return "this systemd runs in a pid namespace below the host's (a container, a box)"
    return None


def probe_own_pid_namespace() -> str | None:
    return "the jobs' pids are the host's" if probe_host_pids() is None else None


PROBES: dict[str, Callable[[], str | None]] = {
    "cuda-torch": lambda: torch_summary()[1],
    "pystemd": probe_pystemd,
    "host-pids": probe_host_pids,
    "own-pid-namespace": probe_own_pid_namespace,
}


def _needs(item: pytest.Item) -> tuple[str, ...]:
    marker = item.get_closest_marker("gpu")
    assert marker is not None
    needs = tuple(marker.kwargs.get("needs", ()))
    unknown = [n for n in needs if n not in NEEDS]
    if unknown:
        raise pytest.UsageError(f"{item.nodeid}: unknown gpu need {unknown[0]!r} ({NEEDS})")
    return needs


def probed(config: pytest.Config, need: str) -> str | None:
    """Why `need` is not met here (None: it is), probed once per session."""
    cache = config.stash.setdefault(PROBED, {})
    if need not in cache:
        if need == "gpu":
            fake = os.environ.get("GPULAUNCH_GPU_PROC")
            cache[need] = probe_gpu(Path(fake), use_nvml=False) if fake else probe_gpu()
        else:
            cache[need] = PROBES[need]()
    return cache[need]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    keep: list[pytest.Item] = []
    gone: list[pytest.Item] = []
    reasons = config.stash.setdefault(REASONS, {})
    for item in items:
        if item.get_closest_marker("gpu") is None:
            keep.append(item)
            continue
        why = probed(config, "gpu")
        if why is not None:
            if os.environ.get("GPULAUNCH_REQUIRE_GPU") == "1":
                raise pytest.UsageError(f"gpu: GPULAUNCH_REQUIRE_GPU=1 but {why}")
            why = f"no NVIDIA GPU here ({why})"
        else:
            why = next((w for n in _needs(item) if (w := probed(config, n)) is not None), None)
        if why is None:
            keep.append(item)
        else:
            reasons.setdefault(why, []).append(item.nodeid)
            gone.append(item)
    if gone:
        config.hook.pytest_deselected(items=gone)
        items[:] = keep


def not_applicable(config: pytest.Config) -> dict[str, list[str]]:
    """Reason -> the test ids it made not applicable, this session."""
    return dict(config.stash.get(REASONS, {}))


def pytest_terminal_summary(
    terminalreporter: pytest.TerminalReporter, exitstatus: int, config: pytest.Config
) -> None:
    for why, ids in not_applicable(config).items():
        checks = "GPU check" if len(ids) == 1 else "GPU checks"
        terminalreporter.write_line(f"gpu: {why} — {len(ids)} {checks} not applicable")
