"""What `nvidia-smi` says, read the way the GPU checks compare it with gpulaunch.

Only the machine-readable queries (`--query-* --format=csv`), whose columns are
documented in `nvidia-smi --help-query-gpu` / `--help-query-compute-apps`. The parsers
are pure and tested against recorded output in tests/unit (no GPU needed there).
"""

from __future__ import annotations

import csv
import shutil
import subprocess
from dataclasses import dataclass

GPU_QUERY = ["--query-gpu=index,uuid,pci.bus_id", "--format=csv"]
APPS_QUERY = ["--query-compute-apps=pid", "--format=csv,noheader"]
APPS_MEMORY_QUERY = ["--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"]
DRIVER_QUERY = ["--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"]


class NvidiaSmiError(Exception):
    """nvidia-smi is missing, failed, or printed something these parsers do not know."""


@dataclass(frozen=True)
class SmiGpu:
    """One row of `--query-gpu=index,uuid,pci.bus_id`."""

    index: int
    uuid: str
    bus_id: str  # as nvidia-smi prints it: "00000000:18:00.0"


def _rows(text: str) -> list[list[str]]:
    return [
        [cell.strip() for cell in row]
        for row in csv.reader(text.splitlines(), skipinitialspace=True)
        if row and any(cell.strip() for cell in row)
    ]


def parse_gpus(text: str) -> tuple[SmiGpu, ...]:
    """`nvidia-smi --query-gpu=index,uuid,pci.bus_id --format=csv` (with its header)."""
    rows = _rows(text)
    if not rows or [c.lower() for c in rows[0]] != ["index", "uuid", "pci.bus_id"]:
        raise NvidiaSmiError(f"unexpected header in nvidia-smi's GPU list: {text[:200]!r}")
    gpus = []
    for row in rows[1:]:
        if len(row) != 3 or not row[0].isdigit():
            raise NvidiaSmiError(f"unexpected row in nvidia-smi's GPU list: {row}")
        gpus.append(SmiGpu(index=int(row[0]), uuid=row[1], bus_id=row[2]))
    return tuple(gpus)


def parse_pids(text: str) -> frozenset[int]:
    """`--query-compute-apps=pid --format=csv,noheader` (also with `,used_memory`).

    No line at all when no process uses a GPU; some versions say so in words instead.
    """
    pids: set[int] = set()
    for row in _rows(text):
        if row[0].lower().startswith("no running"):
            continue
        if not row[0].isdigit():
            raise NvidiaSmiError(f"unexpected line in nvidia-smi's process list: {row}")
        pids.add(int(row[0]))
    return frozenset(pids)


def parse_app_memory(text: str) -> dict[int, int]:
    """`--query-compute-apps=pid,used_memory --format=csv,noheader,nounits`: MiB per pid."""
    out: dict[int, int] = {}
    for row in _rows(text):
        if row[0].lower().startswith("no running"):
            continue
        if len(row) != 2 or not row[0].isdigit():
            raise NvidiaSmiError(f"unexpected line in nvidia-smi's process list: {row}")
        out[int(row[0])] = out.get(int(row[0]), 0) + (int(row[1]) if row[1].isdigit() else 0)
    return out


def run(args: list[str], timeout: float = 30) -> str:
    """nvidia-smi's stdout for these arguments; NvidiaSmiError when it cannot answer."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        raise NvidiaSmiError("nvidia-smi not found on PATH")
    try:
        res = subprocess.run([exe, *args], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise NvidiaSmiError(f"nvidia-smi {' '.join(args)} took over {timeout} s") from None
    if res.returncode != 0:
        why = (res.stdout + res.stderr).strip().splitlines()
        raise NvidiaSmiError(f"nvidia-smi exit {res.returncode}: {why[-1] if why else ''}")
    return res.stdout


def gpus() -> tuple[SmiGpu, ...]:
    return parse_gpus(run(GPU_QUERY))


def compute_pids() -> frozenset[int]:
    return parse_pids(run(APPS_QUERY))
