"""Placement: GPUs and CPUs per rank, GPU isolation, and how they reach the spec and the CLI."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from gpulaunch.cli import build_parser, start_options
from gpulaunch.errors import UsageError
from gpulaunch.plan.gpus import Gpu, StaticInventory
from gpulaunch.plan.placement import (
    SHARED_NVIDIA_DEVICES,
    Machine,
    Resources,
    check_memory_max,
    place_ranks,
)
from gpulaunch.plan.spec import StartOptions, make_spec
from gpulaunch.plan.topology import CpuBind, CpuTopology, parse_cpu_list
from tests.fake_machine import four_gpu_machine
from tests.unit.fakes import Untouchable
from tests.unit.fakes import placement_options as options

UUIDS = [f"GPU-{i:08x}-aaaa-bbbb-cccc-{i:012x}" for i in range(4)]
TOPOLOGY = CpuTopology(
    online=tuple(range(16)),
    nodes={0: (0, 1, 2, 3, 8, 9, 10, 11), 1: (4, 5, 6, 7, 12, 13, 14, 15)},
    siblings={cpu: tuple(sorted((cpu % 8, cpu % 8 + 8))) for cpu in range(16)},
)


def gpus(uuids: bool = True) -> tuple[Gpu, ...]:
    """Four GPUs, two per NUMA node, minors not in index order."""
    minors = [0, 1, 3, 2]
    return tuple(
        Gpu(
            index=i,
            minor=minors[i],
            bus_id=f"0000:{0x1B + 0x20 * i:02x}:00.0",
            uuid=UUIDS[i] if uuids else None,
            numa_node=i // 2,
        )
        for i in range(4)
    )


def machine(found: tuple[Gpu, ...] = gpus()) -> Machine:
    """A stand-in machine: fixed GPUs and CPUs."""
    return Machine(StaticInventory(found), lambda: TOPOLOGY)


def test_nothing_asked_reads_nothing() -> None:
    places = place_ranks(Resources(), 3, {}, Machine(Untouchable(), Untouchable()))
    assert all(
        p.gpu is None and p.cpus is None and not p.device_allow and not p.env for p in places
    )


def test_cpus_alone_never_read_the_gpus() -> None:
    m = Machine(Untouchable(), lambda: TOPOLOGY)
    places = place_ranks(Resources(cpus_per_rank=2), 2, {}, m)
    assert [p.cpus for p in places] == ["0,8", "1,9"]


def test_gpu_isolation() -> None:
    places = place_ranks(Resources(gpu_isolation=True), 4, {}, machine())
    for rank, place in enumerate(places):
        gpu = gpus()[rank]
        assert place.gpu == gpu
        assert place.env == {"CUDA_VISIBLE_DEVICES": UUIDS[rank]}
        assert place.device_allow == ((f"/dev/char/195:{gpu.minor}", "rw"), *SHARED_NVIDIA_DEVICES)
        others = {f"/dev/char/195:{g.minor}" for g in gpus() if g != gpu}
        assert not others & {path for path, _ in place.device_allow}
    assert dict(SHARED_NVIDIA_DEVICES) == {
        "/dev/char/195:255": "rw",  # nvidiactl
        "/dev/char/195:254": "rw",  # nvidia-modeset
        "char-nvidia-uvm": "rw",
        "char-nvidia-caps": "r",
    }


def test_gpu_isolation_by_index_sets_the_pci_order() -> None:
    places = place_ranks(Resources(gpu_isolation=True), 2, {}, machine(gpus(uuids=False)))
    assert [p.env for p in places] == [
        {"CUDA_VISIBLE_DEVICES": "0", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"},
        {"CUDA_VISIBLE_DEVICES": "1", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"},
    ]


def test_gpus_without_isolation_share_the_list() -> None:
    places = place_ranks(Resources(gpus=(3, 1)), 2, {}, machine())
    assert [p.gpu_index for p in places] == [3, 1]
    assert all(p.env == {"CUDA_VISIBLE_DEVICES": f"{UUIDS[3]},{UUIDS[1]}"} for p in places)
    assert all(p.device_allow == () for p in places)


def test_gpus_count_in_the_callers_cuda_visible_devices() -> None:
    env = {"CUDA_VISIBLE_DEVICES": "2,3"}
    places = place_ranks(Resources(gpus=(1,), gpu_isolation=True), 1, env, machine())
    assert places[0].gpu_index == 3
    assert places[0].device_allow[0] == ("/dev/char/195:2", "rw")  # GPU 3's minor is 2


def test_fewer_ranks_than_gpus_take_the_first() -> None:
    places = place_ranks(Resources(gpus=(2, 0, 1)), 2, {}, machine())
    assert [p.gpu_index for p in places] == [2, 0]


@pytest.mark.parametrize(
    ("resources", "nproc", "env", "found", "message"),
    [
        (
            Resources(gpu_isolation=True),
            1,
            {},
            (),
            "--gpu-isolation needs NVIDIA GPUs, but none were found",
        ),
        (Resources(gpus=(0,)), 1, {}, (), "--gpus needs NVIDIA GPUs, but none were found"),
        (
            Resources(gpus=(0,)),
            1,
            {"CUDA_VISIBLE_DEVICES": ""},
            gpus(),
            "--gpus needs NVIDIA GPUs, but CUDA_VISIBLE_DEVICES='' leaves none visible",
        ),
        (
            Resources(gpus=(2,)),
            1,
            {"CUDA_VISIBLE_DEVICES": "0,1"},
            gpus(),
            "--gpus names GPU 2, but 2 are visible (0-1)",
        ),
        (
            Resources(gpu_isolation=True),
            5,
            {},
            gpus(),
            "5 ranks need 5 GPUs, but only 4 visible (0-3)",
        ),
        (Resources(gpus=(0, 1)), 3, {}, gpus(), "3 ranks need 3 GPUs, but only 2 chosen"),
    ],
)
def test_gpu_errors(
    resources: Resources, nproc: int, env: dict[str, str], found: tuple[Gpu, ...], message: str
) -> None:
    with pytest.raises(UsageError) as err:
        place_ranks(resources, nproc, env, machine(found))
    assert err.value.message.startswith(message)
    assert "\n" not in err.value.message


def test_numa_bind_uses_the_ranks_gpus() -> None:
    places = place_ranks(
        Resources(gpus=(2, 0, 3), cpu_bind=CpuBind.NUMA), 3, {}, machine()
    )  # nodes 1, 0, 1
    sets = [set(parse_cpu_list(p.cpus or "")) for p in places]
    assert sets[1] == set(TOPOLOGY.nodes[0])
    assert sets[0] | sets[2] == set(TOPOLOGY.nodes[1]) and not sets[0] & sets[2]


def test_numa_bind_without_gpu_options_uses_cuda_numbering() -> None:
    """rank i would use cuda:i: the i-th visible GPU gives its locality, nothing else changes."""
    env = {"CUDA_VISIBLE_DEVICES": "3,2"}  # both on node 1
    places = place_ranks(Resources(cpu_bind=CpuBind.NUMA), 2, env, machine())
    assert [p.cpus for p in places] == ["4-5,12-13", "6-7,14-15"]
    assert all(p.gpu is None and not p.env and not p.device_allow for p in places)


def test_numa_bind_without_gpus_splits_evenly() -> None:
    places = place_ranks(Resources(cpu_bind=CpuBind.NUMA), 2, {}, machine(()))
    assert [p.cpus for p in places] == ["0-3,8-11", "4-7,12-15"]
    bad_pool = {"CUDA_VISIBLE_DEVICES": "MIG-0"}  # not a reason to refuse a CPU option
    places = place_ranks(Resources(cpu_bind=CpuBind.NUMA), 2, bad_pool, machine())
    assert [p.cpus for p in places] == ["0-3,8-11", "4-7,12-15"]


@pytest.mark.parametrize("text", ["1G", "512M", "1.5G", "20%", "infinity", "1073741824"])
def test_memory_max_accepted(text: str) -> None:
    check_memory_max(text)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("12X", "not a size"),
        ("-1G", "negative size"),
        ("101%", "percentage above 100%"),
        ("0", "no memory at all"),
        ("0%", "no memory at all"),
        ("", "not a size"),
    ],
)
def test_memory_max_refused(text: str, problem: str) -> None:
    with pytest.raises(UsageError, match=problem) as err:
        check_memory_max(text)
    assert err.value.message.startswith(f"--memory-max {text}")


# --- through the plan and the command line


def test_spec_carries_the_placement(script: Path) -> None:
    opts = options(script, resources=Resources(gpu_isolation=True, cpus_per_rank=2))
    base = {"CUDA_VISIBLE_DEVICES": "1,0", "PATH": "/bin"}
    spec = make_spec(opts, base, str(script.parent), machine())
    for rank, gpu in zip(spec.ranks, (1, 0), strict=True):
        assert rank.env["CUDA_VISIBLE_DEVICES"] == UUIDS[gpu]
        assert rank.env["LOCAL_RANK"] == str(rank.local_rank)  # unchanged
        assert rank.env["PATH"] == "/bin"
        assert rank.gpu == gpu
        assert rank.device_allow[0] == (f"/dev/char/195:{gpu}", "rw")
    assert [r.cpus for r in spec.ranks] == ["0,8", "1,9"]


def test_spec_checks_memory_max_before_anything_else_is_read(script: Path) -> None:
    opts = options(script, memory_max="lots", resources=Resources(gpu_isolation=True))
    with pytest.raises(UsageError, match="--memory-max lots"):
        make_spec(opts, {}, str(script.parent), Machine(Untouchable(), Untouchable()))


def test_spec_reads_a_fake_machine_root(script: Path, tmp_path: Path) -> None:
    root = four_gpu_machine(tmp_path / "machine")
    opts = options(script, resources=Resources(gpus=(2, 3), gpu_isolation=True), machine_root=root)
    spec = make_spec(opts, {}, str(script.parent))
    assert [r.gpu for r in spec.ranks] == [2, 3]
    assert [r.device_allow[0][0] for r in spec.ranks] == ["/dev/char/195:3", "/dev/char/195:2"]


Parse = Callable[..., StartOptions]


@pytest.fixture
def parse(script: Path, monkeypatch: pytest.MonkeyPatch) -> Parse:
    monkeypatch.chdir(script.parent)

    def run(*argv: str) -> StartOptions:
        return start_options(build_parser().parse_args(["start", *argv, script.name]))

    return run


def test_cli_defaults(parse: Parse) -> None:
    opts = parse()
    assert opts.nproc == 1
    assert opts.resources == Resources()
    assert opts.machine_root is None


def test_cli_placement_options(parse: Parse) -> None:
    opts = parse("--gpus", "0,2,3", "--gpu-isolation", "--cpus-per-rank", "4", "--cpu-bind", "numa")
    assert opts.nproc == 3  # one rank per GPU
    assert opts.resources == Resources(
        gpus=(0, 2, 3), gpu_isolation=True, cpus_per_rank=4, cpu_bind=CpuBind.NUMA
    )
    assert parse("--gpus", "0-3", "--nproc", "2").nproc == 2


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--gpus", "0,x"], "argument --gpus: 'x' is not a GPU number or range"),
        (["--cpu-bind", "socket"], "argument --cpu-bind: invalid choice: 'socket'"),
        (["--cpus-per-rank", "two"], "argument --cpus-per-rank: not a whole number: 'two'"),
    ],
)
def test_cli_placement_errors(parse: Parse, argv: list[str], message: str) -> None:
    with pytest.raises(UsageError) as err:
        parse(*argv)
    assert err.value.message.startswith(message)


def test_machine_root_is_hidden(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["start", "--help"])
    shown = capsys.readouterr().out
    assert "--gpu-isolation" in shown and "--machine-root" not in shown
