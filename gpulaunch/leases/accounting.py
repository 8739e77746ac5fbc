"""GPU accounting of a job, for its report and record (`gpulaunch list --all --json`).

Per rank (its main process, on its GPU), from NVML's accounting (`nvidia-smi -am 1`, root;
off: unknown, never 0): peak GPU memory (`maxMemoryUsage`) and mean utilisation over its life
(`gpuUtilization`); and the XIDs NVML's event API reported on its GPU while the job ran
(health.py registers for them when the gate opens). For the job: GPU-seconds (the GPUs its
ranks use x its wall time: known without NVML) and energy (NVML's total energy counter of
each GPU, at the end minus when the gate opened; Volta and later).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpulaunch.model import GpuUse, JobReport, JobSpec, RankGpuUse

if TYPE_CHECKING:
    from gpulaunch.leases.health import Gate


def _stats(gate: Gate, gpu: int, pid: int | None) -> tuple[int | None, int | None]:
    handle = gate.handle(gpu)
    if handle is None or pid is None:
        return None, None
    nvml = gate.nvml
    try:
        if nvml.nvmlDeviceGetAccountingMode(handle) != getattr(nvml, "NVML_FEATURE_ENABLED", 1):
            return None, None
        stats: Any = nvml.nvmlDeviceGetAccountingStats(handle, pid)
    except Exception:  # not supported, no record of this pid
        return None, None
    memory = getattr(stats, "maxMemoryUsage", None)
    util = getattr(stats, "gpuUtilization", None)
    return (
        memory if isinstance(memory, int) else None,
        util if isinstance(util, int) else None,
    )


def gpu_use(spec: JobSpec, report: JobReport, gate: Gate | None, seconds: float) -> GpuUse | None:
    """The job's GPU accounting; None when no rank has a GPU."""
    on_gpu = {r.rank: r.gpu for r in spec.ranks if r.gpu is not None}
    if not on_gpu:
        return None
    if gate is not None:
        gate.collect_xids()
    pids = {r.rank: r.pid for r in report.ranks}
    ranks = []
    for rank, gpu in sorted(on_gpu.items()):
        memory, util = _stats(gate, gpu, pids.get(rank)) if gate is not None else (None, None)
        xids = tuple(gate.xids.get(gpu, ())) if gate is not None else ()
        ranks.append(RankGpuUse(rank, gpu, memory, util, xids))
    energy = None
    if gate is not None and gate.energy_at_open:
        total = 0
        for gpu, start in gate.energy_at_open.items():
            try:
                total += (
                    int(gate.nvml.nvmlDeviceGetTotalEnergyConsumption(gate.handle(gpu))) - start
                )
            except Exception:
                total = -1
                break
        energy = total / 1000 if total >= 0 else None
    return GpuUse(tuple(ranks), len(set(on_gpu.values())) * seconds, energy)
