"""Per-rank resources against a real systemd: what `render` prints is what systemd reports,
limits take effect where the kernel has the controllers, and GPU isolation without a GPU.

GPU isolation is proven with fake device nodes: character devices with the NVIDIA major
(195) in a tmpfs mounted inside the box's private /tmp (never the host's /dev). Opening
a node whose driver is missing fails with ENXIO/ENODEV when the device cgroup lets the
open through, and with EPERM when `DevicePolicy=closed`/`DeviceAllow=` refuse it. The
GPUs themselves come from a stand-in machine (`--machine-root`, tests/fake_machine.py).
"""

from __future__ import annotations

import errno
import json
import os
import re
import shlex
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

from gpulaunch.units.codec import INFINITY, parse_unit
from gpulaunch.units.values import parse_boolean, parse_cpu_set, parse_timespan
from sdbox import Box
from tests.fake_machine import FakeGpu, write_fake_machine
from tests.integration.jobs import GPULAUNCH, REPO, Job, wait_until

pytestmark = pytest.mark.integration

SCRIPT = str(REPO / "tests" / "integration" / "scripts" / "resources_rank.py")
UUIDS = ["GPU-0a0a0a0a-1111-2222-3333-444444444444", "GPU-1b1b1b1b-1111-2222-3333-444444444444"]
# Opened by every rank of the isolation test besides the fake GPUs: DevicePolicy=closed
# must leave what a process needs (systemd.resource-control(5), "closed").
SLEEP = ["--sleep", "300"]
PSEUDO = ["/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom", "/dev/ptmx"]


def online_cpus() -> str:
    return Path("/sys/devices/system/cpu/online").read_text().strip()


def fake_machine(job: Job) -> Path:
    """Two GPUs (minors 0 and 1) on NUMA node 0, and this machine's real online CPUs."""
    return write_fake_machine(
        job.dir / "machine",
        [FakeGpu("0000:1b:00.0", 0, UUIDS[0], 0), FakeGpu("0000:3d:00.0", 1, UUIDS[1], 0)],
        online=online_cpus(),
        nodes={0: online_cpus()},
    )


def rendered(job: Job, opts: list[str], script_args: list[str]) -> dict[str, dict[str, object]]:
    """`gpulaunch render` for these options, each unit's text read back by the codec."""
    script = [SCRIPT, "--dir", str(job.dir), *script_args]
    res = job.box.run(
        [GPULAUNCH, "render", "--job", job.id, *opts, *script],
        cwd=str(REPO),
        capture_output=True,
        text=True,
        check=True,
    )
    parts = re.split(r"^# (\S+\.(?:slice|scope|service)) \(from .+\)$", res.stdout, flags=re.M)
    units = {}
    for name, text in zip(parts[1::2], parts[2::2], strict=True):
        kind = name.rpartition(".")[2]
        if kind != "service":  # the anchor (its pid is render's): its own tests
            units[name] = {p.name: p.value for p in parse_unit(text, kind, name)}
    return units


def _names(text: str) -> object:
    return sorted(shlex.split(text))  # names with a backslash (\x2d) are printed quoted


def _devices(text: str) -> object:
    return sorted(tuple(line.split(" ", 1)) for line in text.splitlines() if line)


# How `systemctl show --value -p NAME` prints each compared property, read back into the
# codec's value; lists are compared as sorted lists (systemd keeps its own order).
SHOWN: dict[str, Callable[[str], object]] = {
    "MemoryMax": lambda text: INFINITY if text == "infinity" else int(text),
    "AllowedCPUs": lambda text: int.from_bytes(parse_cpu_set(text), "little"),
    "DevicePolicy": str,
    "DeviceAllow": _devices,
    "TimeoutStopUSec": parse_timespan,
    "BindsTo": _names,
    "After": _names,
    "PropagatesStopTo": _names,
    "Slice": str,
    "CollectMode": str,
    "KillMode": str,
    "SendSIGKILL": parse_boolean,
    "Description": str,
}


def _expected(name: str, value: object) -> object:
    if name == "AllowedCPUs":
        assert isinstance(value, bytes)
        return int.from_bytes(value, "little")
    if name == "DeviceAllow":
        return sorted(tuple(item) for item in value)  # type: ignore[attr-defined]
    if isinstance(value, list):
        return sorted(value)
    return value


def shown(job: Job, unit: str, prop: str) -> str:
    return job.box.run(
        ["systemctl", "show", "--value", "-p", prop, unit],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.rstrip("\n")


def cgroup_file(job: Job, unit: str, name: str) -> str | None:
    """A file of the unit's cgroup as the box sees it; None if it does not exist."""
    path = f"/sys/fs/cgroup{shown(job, unit, 'ControlGroup')}/{name}"
    res = job.box.run(["cat", path], capture_output=True, text=True)
    return res.stdout.strip() if res.returncode == 0 else None


@pytest.fixture
def running(job: Job) -> Iterator[Callable[..., subprocess.Popen[str]]]:
    """Start a job of `resources_rank.py` ranks that sleep; SIGTERM it at the end."""
    procs: list[subprocess.Popen[str]] = []

    def start(*opts: str, nproc: int, script_args: Sequence[str] = ()) -> subprocess.Popen[str]:
        proc = job.popen(*opts, script=SCRIPT, script_args=[*SLEEP, *script_args])
        procs.append(proc)
        for rank in range(nproc):
            try:
                job.wait_file(f"rank{rank}.ready", timeout=30)
            except AssertionError:
                proc.kill()
                raise AssertionError(proc.communicate()[1]) from None
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            os.kill(job.box.inner_pid(proc), signal.SIGTERM)
        proc.communicate(timeout=30)


def rank_report(job: Job, rank: int) -> dict[str, object]:
    report: dict[str, object] = json.loads((job.dir / f"rank{rank}.json").read_text())
    return report


def test_systemd_reports_what_render_printed(
    job: Job, running: Callable[..., subprocess.Popen[str]]
) -> None:
    nproc = 2 if len(os.sched_getaffinity(0)) >= 2 else 1
    opts = [
        *("--nproc", str(nproc), "--memory-max", "1G", "--cpus-per-rank", "1", "--grace", "7"),
        *("--gpu-isolation", "--machine-root", str(fake_machine(job))),
    ]
    units = rendered(job, opts, SLEEP)
    running(*opts, nproc=nproc)
    compared: set[str] = set()
    mismatches = []
    for unit, props in units.items():
        for name, value in props.items():
            if name not in SHOWN:
                continue
            got = SHOWN[name](shown(job, unit, name))
            want = _expected(name, value)
            if name == "After":  # systemd adds the implicit After= on the slice
                ok = isinstance(got, list) and isinstance(want, list) and set(want) <= set(got)
            else:
                ok = got == want
            if not ok:
                mismatches.append(f"{unit} {name}: rendered {want!r}, systemd shows {got!r}")
            compared.add(name)
    assert not mismatches, "\n".join(mismatches)
    assert compared == set(SHOWN)  # every property of the list was set and compared
    rank0 = units[job.names.rank_scope(0)]
    assert rank0["MemoryMax"] == 2**30 and rank0["DevicePolicy"] == "closed"
    assert rank0["TimeoutStopUSec"] == 7_000_000


def test_allowed_cpus_take_effect_where_cpuset_is_available(
    job: Job, running: Callable[..., subprocess.Popen[str]]
) -> None:
    nproc = 2 if len(os.sched_getaffinity(0)) >= 2 else 1
    running("--nproc", str(nproc), "--cpus-per-rank", "1", nproc=nproc)
    unit = job.names.rank_scope(nproc - 1)
    allowed = shown(job, unit, "AllowedCPUs")
    assert allowed  # systemd took the setting in any case
    controllers = cgroup_file(job, unit, "cgroup.controllers")
    if "cpuset" not in (controllers or "").split():
        # systemd accepts AllowedCPUs= but the kernel cannot apply it: true of the box only,
        # which gets no cgroup controllers (sdbox/README.md); tests/vm/test_inside.py runs
        # this test where the controller is.
        assert isinstance(job.box, Box), f"{unit}: no cpuset controller ({controllers!r})"
        return
    want = set(int(c) for c in re.findall(r"\d+", allowed))
    effective = cgroup_file(job, unit, "cpuset.cpus.effective") or ""
    assert int.from_bytes(parse_cpu_set(effective), "little") == sum(1 << c for c in want)
    assert set(rank_report(job, nproc - 1)["affinity"]) == want  # type: ignore[arg-type]


def test_memory_max_takes_effect_where_memory_is_available(
    job: Job, running: Callable[..., subprocess.Popen[str]]
) -> None:
    running("--nproc", "1", "--memory-max", "256M", nproc=1)
    unit = job.names.rank_scope(0)
    assert shown(job, unit, "MemoryMax") == str(256 * 2**20)
    controllers = cgroup_file(job, unit, "cgroup.controllers")
    if "memory" not in (controllers or "").split():
        # As above: true of the box only; tests/vm/test_inside.py runs this in the VM lab.
        assert isinstance(job.box, Box), f"{unit}: no memory controller ({controllers!r})"
        return
    assert cgroup_file(job, unit, "memory.max") == str(256 * 2**20)


@pytest.fixture
def fake_gpu_nodes(box: object, job: Job) -> Iterator[str]:
    """/tmp/fakegpu-<job>/nvidia0 (c 195 0) and nvidia1 (c 195 1), inside the box only.

    The box's /tmp is its own tmpfs, but mounted nodev (opening any device there fails
    with EACCES before the device cgroup is asked): a tmpfs of its own, mounted in the
    box's private mount namespace, holds the nodes.
    """
    if not isinstance(box, Box):
        pytest.skip("needs the throwaway box: device nodes are made only in its private /tmp")
    where = f"/tmp/fakegpu-{job.id}"
    setup = (
        f"mkdir {where} && mount -t tmpfs -o mode=0755,nosuid fakegpu {where} && "
        f"mknod {where}/nvidia0 c 195 0 && mknod {where}/nvidia1 c 195 1"
    )
    box.run(["sh", "-c", setup], check=True)
    yield where
    box.run(["sh", "-c", f"umount {where} && rmdir {where}"], check=True)


def test_gpu_isolation_without_a_gpu(
    job: Job, fake_gpu_nodes: str, running: Callable[..., subprocess.Popen[str]]
) -> None:
    nodes = [f"{fake_gpu_nodes}/nvidia0", f"{fake_gpu_nodes}/nvidia1"]
    no_driver = {errno.ENXIO, errno.ENODEV}
    # Outside a gpulaunch scope both nodes open as far as the (missing) driver: the EPERM
    # below comes from the device cgroup, not from the nodes.
    probe = (
        "import os, sys\n"
        "for p in sys.argv[1:]:\n"
        "    try: os.open(p, os.O_RDWR)\n"
        "    except OSError as e: print(e.errno)"
    )
    outside = job.box.run([sys.executable, "-c", probe, *nodes], capture_output=True, text=True)
    assert {int(x) for x in outside.stdout.split()} <= no_driver, outside

    running(
        *("--nproc", "2", "--gpu-isolation", "--machine-root", str(fake_machine(job))),
        nproc=2,
        script_args=["--open", ",".join([*nodes, *PSEUDO, "/dev/tty"])],
    )
    for rank in (0, 1):
        report = rank_report(job, rank)
        opened = report["opened"]
        assert isinstance(opened, dict)
        own, other = nodes[rank], nodes[1 - rank]
        assert opened[own] in no_driver, f"rank {rank}: its own GPU node: {opened}"
        assert opened[other] == errno.EPERM, f"rank {rank}: the other rank's GPU node: {opened}"
        assert all(opened[p] == 0 for p in PSEUDO), opened
        assert opened["/dev/tty"] == errno.ENXIO, opened  # allowed; no controlling terminal
        assert report["cuda_visible_devices"] == UUIDS[rank]
        assert report["local_rank"] == str(rank)  # unchanged: the rank's GPU is cuda:0
        assert shown(job, job.names.rank_scope(rank), "Description").endswith(f"(GPU {rank})")


def test_isolated_ranks_run_real_ddp_training(job: Job) -> None:
    """DevicePolicy=closed leaves what Python, torch and gloo need (the example, on CPU)."""
    res = job.box.run(
        [
            *(GPULAUNCH, "start", "--job", job.id, "--nproc", "2", "--gpu-isolation"),
            *("--machine-root", str(fake_machine(job))),
            *("examples/ddp_train.py", "--steps", "3"),
        ],
        cwd=str(REPO),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert "succeeded" in res.stderr
    wait_until(lambda: not job.units(), 5, "the job's units to go away")


@pytest.mark.parametrize("option", [["--gpu-isolation"], ["--gpus", "0"]])
def test_gpu_options_without_gpus(job: Job, option: list[str]) -> None:
    empty = job.dir / "no-gpus"
    empty.mkdir()
    res = job.box.run(
        [*job.argv(*option, "--machine-root", str(empty))],
        cwd=str(REPO),
        capture_output=True,
        text=True,
    )
    assert res.returncode == 2, res.stderr
    assert res.stderr.startswith(f"gpulaunch: error: {option[0]} needs NVIDIA GPUs, but none")
    assert res.stderr.count("\n") == 1 and "Traceback" not in res.stderr
    assert not job.units()
