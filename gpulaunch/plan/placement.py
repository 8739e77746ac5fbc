"""Where each local rank runs: its GPU, its CPUs, the devices its scope may open.

From `--gpus`, `--gpu-isolation`, `--cpus-per-rank` and `--cpu-bind` plus what the
machine has (`gpulaunch.plan.gpus`, `gpulaunch.plan.topology`) to one `Placement` per local
rank. `gpulaunch.plan.spec` puts the results into the rank's environment and the
`gpu`, `cpus` and `device_allow` variables of `units/rank.scope`.

GPU isolation (systemd.resource-control(5), DevicePolicy=/DeviceAllow=): each rank
sees only its GPU (CUDA_VISIBLE_DEVICES), and its scope may open only that GPU's
node plus the driver's shared nodes. `DevicePolicy=closed` itself already allows
the pseudo devices every process needs: /dev/null, /dev/zero, /dev/full,
/dev/random, /dev/urandom, /dev/tty, /dev/ptmx and the ptys (char-pts); /dev/shm
is a file system and needs no rule. The device cgroup is enforced only for the
system manager (docs/architecture.md); a user manager accepts the rules and
enforces none of them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gpulaunch.errors import UsageError
from gpulaunch.plan.gpus import (
    NVIDIA_MAJOR,
    NVIDIA_MODESET_MINOR,
    NVIDIACTL_MINOR,
    Gpu,
    Inventory,
    MachineInventory,
    visible_pool,
)
from gpulaunch.plan.topology import CpuBind, CpuTopology, plan_cpus, read_topology
from gpulaunch.units.values import InvalidValue, parse_permyriad, parse_size

# Every isolated rank may open these besides its own GPU (docs/architecture.md).
SHARED_NVIDIA_DEVICES: tuple[tuple[str, str], ...] = (
    (f"/dev/char/{NVIDIA_MAJOR}:{NVIDIACTL_MINOR}", "rw"),  # /dev/nvidiactl
    (f"/dev/char/{NVIDIA_MAJOR}:{NVIDIA_MODESET_MINOR}", "rw"),  # /dev/nvidia-modeset
    ("char-nvidia-uvm", "rw"),  # /dev/nvidia-uvm, /dev/nvidia-uvm-tools (dynamic major)
    ("char-nvidia-caps", "r"),  # /dev/nvidia-caps/nvidia-cap* (MIG capabilities), read-only
)


@dataclass(frozen=True)
class Resources:
    """The placement options as the user gave them (parsed, not yet checked)."""

    gpus: tuple[int, ...] | None = None  # --gpus: positions in the visible pool
    gpu_isolation: bool = False
    cpus_per_rank: int | None = None
    cpu_bind: CpuBind = CpuBind.NONE

    @property
    def wants_gpus(self) -> bool:
        return self.gpu_isolation or self.gpus is not None


@dataclass(frozen=True)
class Placement:
    """Where one local rank runs. `env` holds variables to set in its environment."""

    gpu: Gpu | None = None
    cpus: str | None = None  # AllowedCPUs=, "0-3,8"
    device_allow: tuple[tuple[str, str], ...] = ()  # empty: no device isolation
    env: Mapping[str, str] = field(default_factory=dict)

    @property
    def gpu_index(self) -> int | None:
        return self.gpu.index if self.gpu is not None else None


@dataclass(frozen=True)
class Machine:
    """What placement reads about the machine, only when an option needs it."""

    inventory: Inventory
    topology: Callable[[], CpuTopology]

    @classmethod
    def this(cls) -> Machine:
        """This machine: NVML or /proc/driver/nvidia, and /sys."""
        return cls(MachineInventory(), read_topology)

    @classmethod
    def fake(cls, root: Path) -> Machine:
        """Test stand-in: GPUs from ROOT/proc/driver/nvidia, CPUs and NUMA from ROOT/sys.

        NVML is not used. Only for tests (the hidden --machine-root option).
        """
        sysfs = root / "sys"
        return cls(
            MachineInventory(root / "proc", sysfs, use_nvml=False), lambda: read_topology(sysfs)
        )


def check_memory_max(text: str, option: str = "--memory-max") -> None:
    """`--memory-max`: bytes (K, M, G, T suffixes, base 1024), a percentage, or infinity.

    Checked here so that a bad value is an option error, not one in the rank template.
    """
    if text == "infinity":
        return
    try:
        amount = parse_permyriad(text)
        if amount is None:
            amount = parse_size(text)
    except InvalidValue as exc:
        raise UsageError(
            f"{option} {text}: {exc.problem}",
            "use bytes with a K, M, G or T suffix (base 1024, e.g. 12G), a percentage of "
            "the machine's memory (e.g. 20%), or infinity",
        ) from None
    if amount == 0:
        raise UsageError(f"--memory-max {text} would leave a rank no memory at all")


def _gpu_option(resources: Resources) -> str:
    return "--gpus" if resources.gpus is not None else "--gpu-isolation"


def _choose_gpus(
    resources: Resources, nproc: int, pool: Sequence[Gpu], visible: str | None
) -> tuple[Gpu, ...]:
    option = _gpu_option(resources)
    if not pool:
        if visible is not None:
            why = f"CUDA_VISIBLE_DEVICES={visible!r} leaves none visible"
            hint = "unset CUDA_VISIBLE_DEVICES or name GPUs in it"
        else:
            why = "none were found (neither NVML nor /proc/driver/nvidia/gpus lists one)"
            hint = f"install and load the NVIDIA driver, or leave out {option}"
        raise UsageError(f"{option} needs NVIDIA GPUs, but {why}", hint)
    numbers = f"0-{len(pool) - 1}" if len(pool) > 1 else "0"
    if resources.gpus is not None:
        outside = [i for i in resources.gpus if i >= len(pool)]
        if outside:
            raise UsageError(
                f"--gpus names GPU {outside[0]}, but {len(pool)} "
                f"{'is' if len(pool) == 1 else 'are'} visible ({numbers})",
                "--gpus counts the GPUs that CUDA_VISIBLE_DEVICES leaves visible, from 0",
            )
        chosen = tuple(pool[i] for i in resources.gpus)
    else:
        chosen = tuple(pool)
    if nproc > len(chosen):
        which = "chosen" if resources.gpus is not None else f"visible ({numbers})"
        raise UsageError(
            f"{nproc} ranks need {nproc} GPUs, but only {len(chosen)} {which}",
            "use fewer ranks (--nproc) or more GPUs",
        )
    return chosen[:nproc]


def _gpu_env(gpus: Sequence[Gpu]) -> dict[str, str]:
    env = {"CUDA_VISIBLE_DEVICES": ",".join(gpu.cuda_id for gpu in gpus)}
    if any(gpu.uuid is None for gpu in gpus):
        # Indices, not UUIDs: have CUDA number GPUs the way NVML and /proc do.
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    return env


def place_ranks(
    resources: Resources, nproc: int, base_env: Mapping[str, str], machine: Machine
) -> tuple[Placement, ...]:
    """One placement per local rank.

    GPUs are looked up only when an option needs them: `--gpus`/`--gpu-isolation`
    (errors if there are too few), or `--cpu-bind numa` for locality (then rank i is
    taken to use the i-th visible GPU, as `cuda:LOCAL_RANK` does; no GPUs means no
    locality). Raises UsageError for anything the machine cannot satisfy.
    """
    visible = base_env.get("CUDA_VISIBLE_DEVICES")
    rank_gpus: tuple[Gpu, ...] | None = None
    if resources.wants_gpus:
        pool = visible_pool(machine.inventory.gpus(), visible)
        rank_gpus = _choose_gpus(resources, nproc, pool, visible)
    gpu_nodes: list[int | None] | None = None
    if resources.cpu_bind is CpuBind.NUMA:
        if rank_gpus is None:
            try:
                pool = visible_pool(machine.inventory.gpus(), visible)
            except UsageError:
                pool = ()
            rank_gpus_for_locality = pool[:nproc] if len(pool) >= nproc else ()
        else:
            rank_gpus_for_locality = rank_gpus
        if rank_gpus_for_locality:
            gpu_nodes = [gpu.numa_node for gpu in rank_gpus_for_locality]
    cpus: Sequence[str | None] = [None] * nproc
    if resources.cpus_per_rank is not None or resources.cpu_bind is not CpuBind.NONE:
        planned = plan_cpus(
            machine.topology(),
            nproc,
            per_rank=resources.cpus_per_rank,
            bind=resources.cpu_bind,
            gpu_nodes=gpu_nodes,
        )
        if planned is not None:
            cpus = planned
    placements = []
    for local_rank in range(nproc):
        gpu = rank_gpus[local_rank] if rank_gpus is not None else None
        env: dict[str, str] = {}
        device_allow: tuple[tuple[str, str], ...] = ()
        if rank_gpus is not None and gpu is not None:
            if resources.gpu_isolation:
                env = _gpu_env([gpu])
                device_allow = ((gpu.cgroup_device, "rw"), *SHARED_NVIDIA_DEVICES)
            else:
                env = _gpu_env(rank_gpus)
        placements.append(
            Placement(gpu=gpu, cpus=cpus[local_rank], device_allow=device_allow, env=env)
        )
    return tuple(placements)
