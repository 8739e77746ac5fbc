"""The CPUs of this machine, its NUMA nodes, and which CPUs each rank may use.

Read from sysfs (`sysfs(5)`; `Documentation/ABI/stable/sysfs-devices-system-cpu`
and `sysfs-devices-node` in the kernel tree) under an injectable root, so tests
build fake trees under tmp_path:

- `devices/system/cpu/online`: the online CPUs, a kernel CPU list ("0-7,16-23");
- `devices/system/node/node<N>/cpulist`: the CPUs of NUMA node N;
- `devices/system/cpu/cpu<N>/topology/thread_siblings_list`: the hardware threads of
  CPU N's core (kept together, so two ranks never share a core where it can be avoided);
- `bus/pci/devices/<domain:bus:dev.fn>/numa_node`: a PCI device's node, -1 if unknown.

`plan_cpus` turns `--cpus-per-rank N` / `--cpu-bind numa` into one CPU set per local
rank (the scopes' `AllowedCPUs=`, systemd.resource-control(5)). The sets never overlap.
Pure apart from reading the files; nothing here changes the machine.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gpulaunch.errors import UnavailableError, UsageError
from gpulaunch.numberlist import parse_number_list

SYSFS = Path("/sys")


class CpuBind(enum.StrEnum):
    """`--cpu-bind`: how ranks are placed on CPUs."""

    NONE = "none"  # no AllowedCPUs= (unless --cpus-per-rank asks for sets)
    NUMA = "numa"  # the CPUs of the rank's GPU's NUMA node


def parse_cpu_list(text: str) -> tuple[int, ...]:
    """A kernel CPU list ("0-3,8,10-11", "" for none) as sorted CPU numbers."""
    try:
        return tuple(sorted(set(parse_number_list(text, "CPU number", skip_empty=True))))
    except ValueError as exc:
        raise ValueError(f"bad CPU list {text.strip()!r}: {exc}") from None


def format_cpu_list(cpus: Iterable[int]) -> str:
    """CPU numbers as a CPU list with ranges, the form AllowedCPUs= takes: "0-3,8"."""
    ordered = sorted(set(cpus))
    parts: list[str] = []
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        parts.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(parts)


def normalize_pci_address(bus_id: str) -> str:
    """A PCI address as sysfs names it: NVML's "00000000:3B:00.0" -> "0000:3b:00.0"."""
    m = re.fullmatch(
        r"(?:([0-9A-Fa-f]{1,8}):)?([0-9A-Fa-f]{1,2}):([0-9A-Fa-f]{1,2})\.([0-7])", bus_id
    )
    if not m:
        raise ValueError(f"not a PCI address: {bus_id!r}")
    domain = int(m.group(1) or "0", 16)
    return f"{domain:04x}:{int(m.group(2), 16):02x}:{int(m.group(3), 16):02x}.{m.group(4)}"


def pci_numa_node(bus_id: str, sysfs: Path = SYSFS) -> int | None:
    """The NUMA node of a PCI device, or None where the kernel does not know it (-1)."""
    try:
        address = normalize_pci_address(bus_id)
        text = (sysfs / "bus/pci/devices" / address / "numa_node").read_text().strip()
        node = int(text)
    except (OSError, ValueError):
        return None
    return node if node >= 0 else None


@dataclass(frozen=True)
class CpuTopology:
    """The online CPUs, grouped into NUMA nodes and cores.

    `nodes` maps node numbers to their online CPUs (empty when the kernel has no NUMA
    information); `siblings` maps a CPU to the online threads of its core (a CPU missing
    there is a core of its own).
    """

    online: tuple[int, ...]
    nodes: Mapping[int, tuple[int, ...]] = field(default_factory=dict)
    siblings: Mapping[int, tuple[int, ...]] = field(default_factory=dict)

    def cores(self, cpus: Iterable[int]) -> list[tuple[int, ...]]:
        """`cpus` as whole cores where possible: groups of sibling threads, by first CPU."""
        wanted = set(cpus)
        groups: dict[int, list[int]] = {}
        for cpu in sorted(wanted):
            core = [c for c in self.siblings.get(cpu, (cpu,)) if c in wanted] or [cpu]
            groups.setdefault(min(core), [])
            if cpu not in groups[min(core)]:
                groups[min(core)].append(cpu)
        return [tuple(sorted(groups[key])) for key in sorted(groups)]

    def in_node_order(self) -> list[int]:
        """Every online CPU once: node by node, core by core (CPUs of no node last)."""
        order: list[int] = []
        for node in sorted(self.nodes):
            order += [cpu for core in self.cores(self.nodes[node]) for cpu in core]
        placed = set(order)
        order += [
            cpu for core in self.cores(c for c in self.online if c not in placed) for cpu in core
        ]
        return order


def read_topology(sysfs: Path = SYSFS) -> CpuTopology:
    """The CPU topology as sysfs shows it (`sysfs` is "/sys" or a fake tree)."""
    cpu_dir = sysfs / "devices/system/cpu"
    try:
        online = parse_cpu_list((cpu_dir / "online").read_text())
    except (OSError, ValueError) as exc:
        raise UnavailableError(
            f"cannot read this machine's online CPUs from {cpu_dir / 'online'}: {exc}",
            "leave out --cpus-per-rank and --cpu-bind",
        ) from exc
    present = set(online)
    nodes: dict[int, tuple[int, ...]] = {}
    for path in (sysfs / "devices/system/node").glob("node[0-9]*/cpulist"):
        try:
            cpus = tuple(c for c in parse_cpu_list(path.read_text()) if c in present)
        except (OSError, ValueError):
            continue
        if cpus:
            nodes[int(path.parent.name.removeprefix("node"))] = cpus
    siblings: dict[int, tuple[int, ...]] = {}
    for cpu in online:
        path = cpu_dir / f"cpu{cpu}/topology/thread_siblings_list"
        try:
            siblings[cpu] = tuple(c for c in parse_cpu_list(path.read_text()) if c in present)
        except (OSError, ValueError):
            continue
    return CpuTopology(online=online, nodes=nodes, siblings=siblings)


def _split_evenly(topology: CpuTopology, cpus: Sequence[int], parts: int) -> list[list[int]]:
    """`cpus` in `parts` disjoint sets whose sizes differ by at most one core (or CPU).

    Whole cores where there are at least as many cores as parts, so that two ranks do not
    share a core's threads; else single CPUs.
    """
    cores = topology.cores(cpus)
    units: list[tuple[int, ...]] = cores if len(cores) >= parts else [(c,) for c in sorted(cpus)]
    base, extra = divmod(len(units), parts)
    out: list[list[int]] = []
    start = 0
    for i in range(parts):
        size = base + (1 if i < extra else 0)
        out.append([cpu for unit in units[start : start + size] for cpu in unit])
        start += size
    return out


def _blocks(
    topology: CpuTopology, domains: Sequence[Sequence[int]], count: int, size: int
) -> list[list[int]] | None:
    """`count` disjoint sets of `size` CPUs, each inside one domain where it fits.

    Domains (NUMA nodes, or all CPUs) are filled one after the other with whole blocks;
    ranks left over take blocks from what the domains have left. None if the CPUs do not
    suffice.
    """
    out: list[list[int]] = []
    leftover: list[int] = []
    for domain in domains:
        order = [cpu for core in topology.cores(domain) for cpu in core]
        while len(out) < count and len(order) >= size:
            out.append(order[:size])
            order = order[size:]
        leftover += order
    while len(out) < count and len(leftover) >= size:
        out.append(leftover[:size])
        leftover = leftover[size:]
    return out if len(out) == count else None


def _node_domains(topology: CpuTopology) -> list[list[int]]:
    order = topology.in_node_order()
    if not topology.nodes:
        return [order]
    domains = [list(topology.nodes[node]) for node in sorted(topology.nodes)]
    placed = {cpu for domain in domains for cpu in domain}
    rest = [cpu for cpu in order if cpu not in placed]
    return domains + ([rest] if rest else [])


def plan_cpus(
    topology: CpuTopology,
    nproc: int,
    *,
    per_rank: int | None = None,
    bind: CpuBind = CpuBind.NONE,
    gpu_nodes: Sequence[int | None] | None = None,
) -> tuple[str, ...] | None:
    """One CPU list per local rank ("0-3,32-35"), or None for no `AllowedCPUs=` at all.

    - `per_rank` N: N CPUs per rank, whole cores first, one NUMA node per rank where
      they fit;
    - `bind` NUMA: each rank gets CPUs of its GPU's node (`gpu_nodes[local_rank]`), the
      node's CPUs split evenly (or N each) among the ranks on it. Where a rank's GPU
      node is unknown (no GPUs, or the kernel says -1), all CPUs are split evenly
      among all ranks instead (or N each), node by node;
    - neither: None.

    The sets of different ranks never overlap. Raises UsageError when the CPUs do not
    suffice, saying how many there are.
    """
    if nproc < 1:
        raise ValueError("nproc must be at least 1")
    if per_rank is not None and per_rank < 1:
        raise UsageError(f"--cpus-per-rank must be at least 1, not {per_rank}")
    if bind is CpuBind.NONE and per_rank is None:
        return None
    total = len(topology.online)
    online = format_cpu_list(topology.online)
    if per_rank is not None and per_rank * nproc > total:
        raise UsageError(
            f"--cpus-per-rank {per_rank} for {nproc} ranks needs {per_rank * nproc} CPUs, "
            f"but this machine has {total} online ({online})",
            f"use --cpus-per-rank {max(total // nproc, 1)} or fewer ranks"
            if total >= nproc
            else "use fewer ranks",
        )
    located = (
        bind is CpuBind.NUMA
        and gpu_nodes is not None
        and len(gpu_nodes) >= nproc
        and all(node is not None and node in topology.nodes for node in gpu_nodes[:nproc])
    )
    if located:
        assert gpu_nodes is not None
        return _plan_by_node(
            topology, nproc, per_rank, [n for n in gpu_nodes[:nproc] if n is not None]
        )
    if per_rank is not None:
        sets = _blocks(topology, _node_domains(topology), nproc, per_rank)
        assert sets is not None  # per_rank * nproc <= total
    else:
        if nproc > total:
            raise UsageError(
                f"--cpu-bind numa for {nproc} ranks needs a CPU per rank, "
                f"but this machine has {total} online ({online})",
                "use fewer ranks, or --cpu-bind none",
            )
        sets = _split_evenly(topology, topology.in_node_order(), nproc)
    return tuple(format_cpu_list(s) for s in sets)


def _plan_by_node(
    topology: CpuTopology, nproc: int, per_rank: int | None, gpu_nodes: Sequence[int]
) -> tuple[str, ...]:
    ranks_on: dict[int, list[int]] = {}
    for rank, node in enumerate(gpu_nodes):
        ranks_on.setdefault(node, []).append(rank)
    sets: dict[int, list[int]] = {}
    for node, ranks in sorted(ranks_on.items()):
        cpus = topology.nodes[node]
        have = f"NUMA node {node} has {len(cpus)} CPUs ({format_cpu_list(cpus)})"
        if per_rank is not None:
            found = _blocks(topology, [cpus], len(ranks), per_rank)
            if found is None:
                raise UsageError(
                    f"{have}, too few for its {len(ranks)} ranks with --cpus-per-rank {per_rank}",
                    f"use --cpus-per-rank {max(len(cpus) // len(ranks), 1)}, or --cpu-bind none",
                )
        else:
            if len(ranks) > len(cpus):
                raise UsageError(
                    f"{have}, fewer than the {len(ranks)} ranks whose GPUs are on it",
                    "use --cpu-bind none",
                )
            found = _split_evenly(topology, cpus, len(ranks))
        for rank, cpu_set in zip(ranks, found, strict=True):
            sets[rank] = cpu_set
    return tuple(format_cpu_list(sets[rank]) for rank in range(nproc))
