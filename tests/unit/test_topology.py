"""CPU topology from fake sysfs trees, and the CPU planner: disjoint sets, node locality, errors."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from gpulaunch.errors import GpulaunchError, UnavailableError, UsageError
from gpulaunch.plan.topology import (
    CpuBind,
    CpuTopology,
    format_cpu_list,
    normalize_pci_address,
    parse_cpu_list,
    pci_numa_node,
    plan_cpus,
    read_topology,
)
from tests.fake_machine import FakeGpu, smt2_siblings, write_fake_machine


@pytest.mark.parametrize(
    ("text", "cpus"),
    [
        ("0", (0,)),
        ("0-3", (0, 1, 2, 3)),
        ("0-1,8-9\n", (0, 1, 8, 9)),
        ("5,3,4", (3, 4, 5)),
        ("", ()),
        ("\n", ()),
    ],
)
def test_parse_cpu_list(text: str, cpus: tuple[int, ...]) -> None:
    assert parse_cpu_list(text) == cpus


@pytest.mark.parametrize("text", ["a", "3-1", "1-", "0-3;5"])
def test_parse_cpu_list_errors(text: str) -> None:
    with pytest.raises(ValueError):
        parse_cpu_list(text)


@pytest.mark.parametrize(
    ("cpus", "text"),
    [((), ""), ((0,), "0"), ((0, 1, 2, 3), "0-3"), ((0, 8, 1, 9), "0-1,8-9"), ((1, 3), "1,3")],
)
def test_format_cpu_list(cpus: tuple[int, ...], text: str) -> None:
    assert format_cpu_list(cpus) == text
    assert parse_cpu_list(text) == tuple(sorted(cpus))


@pytest.mark.parametrize(
    ("bus_id", "address"),
    [
        ("00000000:3B:00.0", "0000:3b:00.0"),  # NVML's form
        ("0000:3b:00.0", "0000:3b:00.0"),  # sysfs's form
        ("3b:00.1", "0000:3b:00.1"),
        ("0001:C1:1F.7", "0001:c1:1f.7"),
    ],
)
def test_normalize_pci_address(bus_id: str, address: str) -> None:
    assert normalize_pci_address(bus_id) == address


@pytest.mark.parametrize("bus_id", ["", "3b:00", "0000:3b:00.8", "zz:00.0"])
def test_normalize_pci_address_errors(bus_id: str) -> None:
    with pytest.raises(ValueError):
        normalize_pci_address(bus_id)


def test_pci_numa_node(tmp_path: Path) -> None:
    write_fake_machine(
        tmp_path,
        [FakeGpu("0000:1b:00.0", 0, numa_node=1), FakeGpu("0000:3d:00.0", 1, numa_node=-1)],
    )
    sysfs = tmp_path / "sys"
    assert pci_numa_node("00000000:1B:00.0", sysfs) == 1
    assert pci_numa_node("0000:3d:00.0", sysfs) is None  # -1: the kernel does not know
    assert pci_numa_node("0000:99:00.0", sysfs) is None  # no such device
    assert pci_numa_node("not an address", sysfs) is None


def test_read_topology(tmp_path: Path) -> None:
    write_fake_machine(
        tmp_path,
        online="0-6",  # CPU 7 is offline
        nodes={0: "0-3", 1: "4-7"},
        siblings={0: "0,4", 4: "0,4", 1: "1,5", 5: "1,5"},
    )
    topo = read_topology(tmp_path / "sys")
    assert topo.online == (0, 1, 2, 3, 4, 5, 6)
    assert topo.nodes == {0: (0, 1, 2, 3), 1: (4, 5, 6)}
    assert topo.siblings[0] == (0, 4) and 2 not in topo.siblings
    # whole cores first: the threads of one core are adjacent
    assert topo.in_node_order() == [0, 1, 2, 3, 4, 5, 6]
    assert topo.cores([0, 1, 4, 5, 6]) == [(0, 4), (1, 5), (6,)]


def test_read_topology_without_numa(tmp_path: Path) -> None:
    write_fake_machine(tmp_path, online="0-3")
    topo = read_topology(tmp_path / "sys")
    assert topo.online == (0, 1, 2, 3) and topo.nodes == {}


def test_read_topology_without_sysfs(tmp_path: Path) -> None:
    with pytest.raises(GpulaunchError, match="cannot read this machine's online CPUs"):
        read_topology(tmp_path / "nothing")


def test_read_topology_of_this_machine() -> None:
    topo = read_topology()
    assert topo.online and set(topo.in_node_order()) == set(topo.online)


# --- the planner


def two_nodes_smt() -> CpuTopology:
    """16 CPUs, 8 cores with 2 threads (c, c+8), nodes 0-3,8-11 and 4-7,12-15."""
    return CpuTopology(
        online=tuple(range(16)),
        nodes={0: (0, 1, 2, 3, 8, 9, 10, 11), 1: (4, 5, 6, 7, 12, 13, 14, 15)},
        siblings={cpu: tuple(sorted((cpu % 8, cpu % 8 + 8))) for cpu in range(16)},
    )


def flat(n: int) -> CpuTopology:
    return CpuTopology(online=tuple(range(n)))


def cpu_sets(planned: tuple[str, ...] | None) -> list[set[int]]:
    assert planned is not None
    return [set(parse_cpu_list(text)) for text in planned]


def assert_disjoint(sets: list[set[int]], online: tuple[int, ...]) -> None:
    for a, b in itertools.combinations(sets, 2):
        assert not a & b, sets
    for s in sets:
        assert s and s <= set(online), sets


def test_no_options_means_no_cpu_sets() -> None:
    assert plan_cpus(two_nodes_smt(), 4) is None
    assert plan_cpus(two_nodes_smt(), 4, bind=CpuBind.NONE, gpu_nodes=[0, 0, 1, 1]) is None


def test_cpus_per_rank_takes_whole_cores_inside_nodes() -> None:
    planned = plan_cpus(two_nodes_smt(), 4, per_rank=4)
    assert planned == ("0-1,8-9", "2-3,10-11", "4-5,12-13", "6-7,14-15")
    planned = plan_cpus(two_nodes_smt(), 3, per_rank=2)
    assert planned == ("0,8", "1,9", "2,10")


def test_cpus_per_rank_blocks_cross_nodes_only_when_needed() -> None:
    # 3 CPUs per rank: node 0 holds two blocks, node 1 two; the CPUs left over are used last
    sets = cpu_sets(plan_cpus(two_nodes_smt(), 5, per_rank=3))
    assert_disjoint(sets, two_nodes_smt().online)
    nodes = two_nodes_smt().nodes
    inside = [any(s <= set(cpus) for cpus in nodes.values()) for s in sets]
    assert inside == [True, True, True, True, False]


def test_cpus_per_rank_too_many() -> None:
    with pytest.raises(UsageError) as err:
        plan_cpus(flat(8), 4, per_rank=3)
    assert err.value.message == (
        "--cpus-per-rank 3 for 4 ranks needs 12 CPUs, but this machine has 8 online (0-7)"
    )
    assert err.value.hint == "use --cpus-per-rank 2 or fewer ranks"
    with pytest.raises(UsageError, match="has 2 online"):
        plan_cpus(flat(2), 3, per_rank=1)


def test_cpus_per_rank_must_be_positive() -> None:
    with pytest.raises(UsageError, match="at least 1, not 0"):
        plan_cpus(flat(8), 2, per_rank=0)


def test_numa_bind_follows_the_gpus_nodes() -> None:
    topo = two_nodes_smt()
    # ranks 0 and 3 on node 1, rank 1 on node 0, rank 2 on node 1
    planned = plan_cpus(topo, 4, bind=CpuBind.NUMA, gpu_nodes=[1, 0, 1, 1])
    sets = cpu_sets(planned)
    assert_disjoint(sets, topo.online)
    assert sets[1] == set(topo.nodes[0])  # alone on its node: all of it
    for rank in (0, 2, 3):
        assert sets[rank] <= set(topo.nodes[1])
    # node 1 (4 cores) split among 3 ranks by whole cores: 2, 1, 1
    assert sorted(len(sets[r]) for r in (0, 2, 3)) == [2, 2, 4]
    assert planned is not None and planned[0] == "4-5,12-13"


def test_numa_bind_with_cpus_per_rank() -> None:
    planned = plan_cpus(two_nodes_smt(), 2, per_rank=2, bind=CpuBind.NUMA, gpu_nodes=[1, 1])
    assert planned == ("4,12", "5,13")


def test_numa_bind_node_too_small() -> None:
    topo = CpuTopology(online=tuple(range(4)), nodes={0: (0,), 1: (1, 2, 3)})
    with pytest.raises(UsageError) as err:
        plan_cpus(topo, 2, bind=CpuBind.NUMA, gpu_nodes=[0, 0])
    assert err.value.message == (
        "NUMA node 0 has 1 CPUs (0), fewer than the 2 ranks whose GPUs are on it"
    )
    with pytest.raises(UsageError, match="NUMA node 1 has 3 CPUs .1-3., too few for its 2 ranks"):
        plan_cpus(topo, 2, per_rank=2, bind=CpuBind.NUMA, gpu_nodes=[1, 1])


@pytest.mark.parametrize(
    "gpu_nodes",
    [None, [None, None, None], [0, None, 1], [0, 5, 1], [0, 1]],  # unknown, partly, too few
    ids=["no-gpus", "all-unknown", "one-unknown", "unknown-node", "fewer-gpus"],
)
def test_numa_bind_without_locality_splits_all_cpus_evenly(
    gpu_nodes: list[int | None] | None,
) -> None:
    planned = plan_cpus(two_nodes_smt(), 3, bind=CpuBind.NUMA, gpu_nodes=gpu_nodes)
    # 8 cores in node order: 3, 3, 2 cores
    assert planned == ("0-2,8-10", "3-5,11-13", "6-7,14-15")


def test_numa_bind_without_numa_information() -> None:
    planned = plan_cpus(flat(10), 3, bind=CpuBind.NUMA, gpu_nodes=[0, 0, 0])
    assert planned == ("0-3", "4-6", "7-9")


def test_numa_bind_more_ranks_than_cpus() -> None:
    with pytest.raises(UsageError, match="needs a CPU per rank, but this machine has 2 online"):
        plan_cpus(flat(2), 3, bind=CpuBind.NUMA)


def test_sets_never_overlap() -> None:
    """Every combination on a few machines: disjoint, non-empty, online CPUs only."""
    uneven = CpuTopology(
        online=(0, 1, 2, 3, 5, 6, 7),  # 4 offline
        nodes={0: (0, 1, 2, 3), 1: (5, 6, 7)},
        siblings={0: (0, 1), 1: (0, 1), 6: (6, 7), 7: (6, 7)},
    )
    for topo in (two_nodes_smt(), flat(7), uneven):
        nodes = sorted(topo.nodes) or [0]
        for nproc in range(1, len(topo.online) + 1):
            for per_rank in (None, 1, 2, 3):
                for bind in CpuBind:
                    for gpu_nodes in (None, [nodes[r % len(nodes)] for r in range(nproc)]):
                        try:
                            planned = plan_cpus(
                                topo, nproc, per_rank=per_rank, bind=bind, gpu_nodes=gpu_nodes
                            )
                        except UsageError:
                            continue
                        if planned is None:
                            assert per_rank is None and bind is CpuBind.NONE
                            continue
                        assert len(planned) == nproc
                        sets = cpu_sets(planned)
                        assert_disjoint(sets, topo.online)
                        if per_rank is not None:
                            assert all(len(s) == per_rank for s in sets)


def test_fake_machine_siblings_helper() -> None:
    assert smt2_siblings(2) == {0: "0,2", 1: "1,3", 2: "0,2", 3: "1,3"}


def test_unreadable_online_cpus_is_the_machines_problem_not_a_bug(tmp_path: Path) -> None:
    """Exit 69 (something this machine lacks), never 70 (internal error)."""
    with pytest.raises(UnavailableError, match="cannot read this machine's online CPUs") as exc:
        read_topology(tmp_path / "sys")
    assert exc.value.exit_code == 69
