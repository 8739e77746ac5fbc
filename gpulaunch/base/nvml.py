"""NVML started, or why not: the one place that imports pynvml and calls nvmlInit (the
GPU list, the health gate and the GPU figures all begin here)."""

from __future__ import annotations

import importlib
from typing import Any


class NvmlUnavailable(Exception):
    """pynvml is missing or NVML did not start; the message says which."""


def start_nvml(nvml: Any = None) -> Any:
    """The pynvml module (`nvml`: a stand-in in tests), initialised; NvmlUnavailable if not."""
    if nvml is None:
        try:
            nvml = importlib.import_module("pynvml")
        except ImportError:
            raise NvmlUnavailable(
                "no NVML (pip install 'gpulaunch[gpu]' for nvidia-ml-py)"
            ) from None
    try:
        nvml.nvmlInit()
    except Exception as exc:  # pynvml.NVMLError: no libnvidia-ml, no driver loaded, ...
        raise NvmlUnavailable(f"NVML did not start: {exc}") from None
    return nvml
