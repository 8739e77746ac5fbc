"""The health gate (gpulaunch/leases/health.py) with the stand-in NVML (tests/fake_nvml): a GPU
with an XID, another process's memory, ECC errors, pending pages or lost is refused in one line
naming it; the same through `gpulaunch start`."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

from gpulaunch.leases.accounting import gpu_use
from gpulaunch.leases.health import Gate, UnhealthyGpuError
from gpulaunch.model import GpuUse, RankGpuUse
from gpulaunch.plan.gpus import Gpu
from gpulaunch.report import gpu_lines
from tests.fake_machine import FakeGpu, write_fake_machine

REPO = Path(__file__).resolve().parents[2]
FAKE_NVML = REPO / "tests" / "fake_nvml"
BUSES = ["0000:1b:00.0", "0000:3d:00.0"]
GPUS = (Gpu(0, 0, BUSES[0]), Gpu(1, 1, BUSES[1]))


def fake_nvml(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **state: Any) -> ModuleType:
    """The stand-in module, loaded fresh, with GPU 0's state from `state` (GPU 1 healthy)."""
    path = tmp_path / "nvml.json"
    path.write_text(json.dumps({BUSES[0]: {"minor": 0, **state}, BUSES[1]: {"minor": 1}}))
    monkeypatch.setenv("GPULAUNCH_TEST_NVML", str(path))
    spec = importlib.util.spec_from_file_location("fake_pynvml", FAKE_NVML / "pynvml.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "fake_pynvml", module)  # for its dataclasses
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    ("state", "reason"),
    [
        ({"xids": [79]}, "XID 79 reported"),
        ({"processes": [[4242, 1 << 30]]}, "another process holds memory on it (pid 4242)"),
        ({"ecc": 2}, "2 uncorrected ECC error(s)"),
        ({"pending_pages": True}, "retired pages are pending"),
        ({"remapped_rows": [0, 1, True, False]}, "rows are pending remapping"),
        ({"remapped_rows": [0, 1, False, True]}, "a row remapping failed"),
    ],
)
def test_an_unfit_gpu_is_refused_naming_it_and_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, state: dict[str, Any], reason: str
) -> None:
    gate = Gate.open(GPUS, nvml=fake_nvml(tmp_path, monkeypatch, **state))
    assert gate is not None
    with pytest.raises(UnhealthyGpuError) as refused:
        gate.check()
    assert refused.value.message.startswith(f"GPU 0 ({BUSES[0]}) is not fit for the job: {reason}")
    assert "GPU 1" not in refused.value.message
    assert refused.value.exit_code == 69


def test_healthy_gpus_pass_and_a_busy_one_passes_when_allowed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    nvml = fake_nvml(tmp_path, monkeypatch, processes=[[4242, 1 << 30]], remapped_rows=[1, 0, 0, 0])
    gate = Gate.open(GPUS, allow_busy=True, nvml=nvml)
    assert gate is not None
    gate.check()
    assert Gate.open(GPUS[1:], nvml=nvml) is not None
    assert Gate.open(GPUS[1:], nvml=nvml).problems() == []  # type: ignore[union-attr]
    # the job's own processes never count (a restart's check)
    assert Gate.open(GPUS, nvml=nvml).problems(own_pids=[4242]) == []  # type: ignore[union-attr]


def test_a_lost_gpu_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(UnhealthyGpuError, match=r"GPU 0 \(0000:1b:00.0\) .*: the GPU is lost"):
        Gate.open(GPUS, nvml=fake_nvml(tmp_path, monkeypatch, lost=True))


def test_an_xid_during_the_run_is_seen_at_the_next_check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    nvml = fake_nvml(tmp_path, monkeypatch)
    gate = Gate.open(GPUS, nvml=nvml)
    assert gate is not None and gate.problems() == []
    state = json.loads(Path(os.environ["GPULAUNCH_TEST_NVML"]).read_text())
    nvml._state[BUSES[1]]["xids"] = [48]  # the driver reports one while the job runs
    assert gate.problems() == [
        f"GPU 1 ({BUSES[1]}) is not fit for the job: XID 48 reported "
        "(see the kernel log: NVRM: Xid)"
    ]
    assert gate.xids == {1: [48]} and state


def test_no_nvml_no_gate() -> None:
    class Broken:
        def nvmlInit(self) -> None:
            raise RuntimeError("no driver")

    assert Gate.open(GPUS, nvml=Broken()) is None
    assert Gate.open((), nvml=Broken()) is None


def test_start_refuses_a_gpu_with_an_xid_in_one_line(tmp_path: Path) -> None:
    machine = write_fake_machine(tmp_path / "m", [FakeGpu(BUSES[0], 0), FakeGpu(BUSES[1], 1)])
    state = tmp_path / "nvml.json"
    state.write_text(json.dumps({BUSES[0]: {"minor": 0, "xids": [79]}, BUSES[1]: {"minor": 1}}))
    script = tmp_path / "train.py"
    script.write_text("open(__file__ + '.ran', 'w')\n")
    env = {
        **os.environ,
        "PYTHONPATH": str(FAKE_NVML),
        "GPULAUNCH_TEST_NVML": str(state),
    }
    env.pop("CUDA_VISIBLE_DEVICES", None)
    gl = [sys.executable, "-m", "gpulaunch", "start", "--supervisor", "direct"]
    gl += ["--machine-root", str(machine)]
    res = subprocess.run(
        [*gl, "--gpus", "0", str(script)], env=env, capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 69, res.stderr
    errors = [line for line in res.stderr.splitlines() if "error" in line]
    assert errors == [
        f"gpulaunch: error: GPU 0 ({BUSES[0]}) is not fit for the job: XID 79 reported (see the "
        "kernel log: NVRM: Xid); use other GPUs (--gpus, or --gpus auto:N to lease fit ones), "
        "or have the GPU reset (nvidia-smi -r)"
    ], res.stderr
    assert not Path(str(script) + ".ran").exists()
    res = subprocess.run(
        [*gl, "--gpus", "1", str(script)], env=env, capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 0, res.stderr  # GPU 1 is fit
    assert Path(str(script) + ".ran").exists()


def test_accounting_per_rank_and_for_the_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    nvml = fake_nvml(
        tmp_path,
        monkeypatch,
        energy_mj=5000,
        energy_step_mj=250_000,
        accounting={"4242": [3 << 30, 87]},
    )
    gate = Gate.open(GPUS, nvml=nvml)
    assert gate is not None
    nvml._state[BUSES[1]]["xids"] = [79]  # during the run, on rank 1's GPU
    spec = SimpleNamespace(ranks=[SimpleNamespace(rank=0, gpu=0), SimpleNamespace(rank=1, gpu=1)])
    report = SimpleNamespace(
        ranks=[SimpleNamespace(rank=0, pid=4242), SimpleNamespace(rank=1, pid=7)]
    )
    use = gpu_use(spec, report, gate, 10.0)  # type: ignore[arg-type]
    assert use is not None
    assert use.gpu_seconds == 20.0 and use.energy_joules == 250.0
    assert use.ranks == (
        RankGpuUse(0, 0, 3 << 30, 87, ()),
        RankGpuUse(1, 1, None, None, (79,)),  # no accounting of its pid: unknown, not 0
    )
    assert GpuUse.from_dict(json.loads(json.dumps(use.to_dict()))) == use
    assert gpu_lines(use) == [
        "GPU use: 20.0 GPU-seconds, 250 J",
        "  rank 0 on GPU 0, peak 3.00 GiB, mean utilisation 87%",
        "  rank 1 on GPU 1, XID 79 during the run (NVML event)",
    ]


def test_accounting_without_nvml_still_counts_gpu_seconds() -> None:
    spec = SimpleNamespace(ranks=[SimpleNamespace(rank=0, gpu=3)])
    use = gpu_use(spec, SimpleNamespace(ranks=[]), None, 2.5)  # type: ignore[arg-type]
    assert use == GpuUse((RankGpuUse(0, 3),), 2.5, None)
    no_gpu = SimpleNamespace(ranks=[SimpleNamespace(rank=0, gpu=None)])
    assert gpu_use(no_gpu, SimpleNamespace(ranks=[]), None, 1.0) is None  # type: ignore[arg-type]


def test_list_all_json_shows_a_finished_jobs_gpu_use(tmp_path: Path) -> None:
    machine = write_fake_machine(tmp_path / "m", [FakeGpu(BUSES[0], 0), FakeGpu(BUSES[1], 1)])
    state = tmp_path / "nvml.json"
    gpu = {"energy_mj": 0, "energy_step_mj": 1000, "accounting": {"*": [1 << 30, 50]}}
    state.write_text(json.dumps({BUSES[0]: {"minor": 0, **gpu}, BUSES[1]: {"minor": 1, **gpu}}))
    script = tmp_path / "train.py"
    script.write_text("pass\n")
    env = {**os.environ, "PYTHONPATH": str(FAKE_NVML), "GPULAUNCH_TEST_NVML": str(state)}
    env.pop("CUDA_VISIBLE_DEVICES", None)
    job = f"acct-{os.getpid()}"
    gl = [sys.executable, "-m", "gpulaunch"]
    res = subprocess.run(
        [*gl, "start", "--supervisor", "direct", "--machine-root", str(machine), "--job", job]
        + ["--gpus", "0,1", str(script)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    assert "GPU use: " in res.stderr and "GPU-seconds, 2 J" in res.stderr, res.stderr
    assert "rank 1 on GPU 1, peak 1.00 GiB, mean utilisation 50%" in res.stderr
    listed = subprocess.run(
        [*gl, "list", "--all", "--json"], env=env, capture_output=True, text=True, timeout=120
    )
    views = [v for v in json.loads(listed.stdout) if v["job"] == job]
    assert len(views) == 1, listed.stdout
    use = views[0]["gpu_use"]
    assert use["energy_joules"] == 2.0 and use["gpu_seconds"] > 0
    assert [
        (r["rank"], r["gpu"], r["peak_memory"], r["mean_utilisation"]) for r in use["ranks"]
    ] == [
        (0, 0, 1 << 30, 50),
        (1, 1, 1 << 30, 50),
    ]


def test_a_restart_is_refused_when_its_gpu_reported_an_xid(tmp_path: Path) -> None:
    machine = write_fake_machine(tmp_path / "m", [FakeGpu(BUSES[0], 0), FakeGpu(BUSES[1], 1)])
    state = tmp_path / "nvml.json"
    state.write_text(json.dumps({BUSES[0]: {"minor": 0}, BUSES[1]: {"minor": 1}}))
    script = tmp_path / "train.py"
    script.write_text(  # the driver reports XID 79 on GPU 1 while rank 0 fails
        "import json, os, sys\n"
        "path = os.environ['GPULAUNCH_TEST_NVML']\n"
        "state = json.load(open(path))\n"
        f"state['{BUSES[1]}']['xids'] = [79]\n"
        "json.dump(state, open(path, 'w'))\n"
        "open(__file__ + '.runs', 'a').write('run\\n')\n"
        "sys.exit(3)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(FAKE_NVML), "GPULAUNCH_TEST_NVML": str(state)}
    env.pop("CUDA_VISIBLE_DEVICES", None)
    res = subprocess.run(
        [sys.executable, "-m", "gpulaunch", "start", "--supervisor", "direct"]
        + ["--machine-root", str(machine), "--gpus", "1", "--max-restarts", "2", str(script)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 69, res.stderr
    assert Path(str(script) + ".runs").read_text() == "run\n"  # never restarted
    assert f"GPU 1 ({BUSES[1]}) is not fit for the job: XID 79 reported" in res.stderr
    # the restart's ranks were stopped before their gates opened; the error is the job's end
    assert res.stderr.rstrip().endswith("or have the GPU reset (nvidia-smi -r)"), res.stderr
