"""The GPU checks' CPU-only parts, so that they cannot rot before a GPU machine comes:
nvidia-smi's output read back, the gate's "not applicable" reporting, the findings page,
and scripts/test-gpu.sh --cpu-only end to end.

The nvidia-smi fixtures are written in the format `nvidia-smi --query-gpu=... --format=csv`
prints (header "index, uuid, pci.bus_id", NVML's 8-digit PCI domain); replace them with a
GPU machine's recorded output once one has run scripts/test-gpu.sh.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpulaunch.plan.topology import normalize_pci_address
from tests.gpu import findings, nvsmi

REPO = Path(__file__).resolve().parents[2]
FIXTURES = Path(__file__).parent / "fixtures" / "nvidia-smi"
pytest_plugins = ["pytester"]


def test_gpu_list_from_nvidia_smi() -> None:
    gpus = nvsmi.parse_gpus((FIXTURES / "query-gpu-3.csv").read_text())
    assert [g.index for g in gpus] == [0, 1, 2]
    assert gpus[1].uuid == "GPU-66666666-7777-8888-9999-000000000000"
    # The form gpulaunch's inventory uses (sysfs's), for comparing the two.
    assert [normalize_pci_address(g.bus_id) for g in gpus] == [
        "0000:18:00.0",
        "0000:2a:00.0",
        "0001:3b:00.0",
    ]
    one = nvsmi.parse_gpus((FIXTURES / "query-gpu-h200x1.csv").read_text())
    assert len(one) == 1 and one[0].bus_id == "00000000:18:00.0"


@pytest.mark.parametrize(
    "text", ["", "0, GPU-1, 00000000:18:00.0\n", "index, uuid, pci.bus_id\nzero, x, y\n"]
)
def test_unexpected_gpu_list_is_an_error(text: str) -> None:
    with pytest.raises(nvsmi.NvidiaSmiError):
        nvsmi.parse_gpus(text)


def test_compute_apps_from_nvidia_smi() -> None:
    assert nvsmi.parse_pids((FIXTURES / "compute-apps-2.csv").read_text()) == {4242, 4243}
    assert nvsmi.parse_pids((FIXTURES / "compute-apps-none.csv").read_text()) == frozenset()
    assert nvsmi.parse_pids("No running processes found\n") == frozenset()
    memory = nvsmi.parse_app_memory((FIXTURES / "compute-apps-memory.csv").read_text())
    assert memory == {4242: 268, 4243: 520}
    with pytest.raises(nvsmi.NvidiaSmiError):
        nvsmi.parse_pids("[Not Supported]\n")


GPU_TESTS = """
import pytest

@pytest.mark.gpu
def test_needs_a_gpu():
    pass

@pytest.mark.gpu(needs=("pystemd",))
def test_needs_pystemd():
    pass

def test_plain():
    pass
"""


def run_gate(pytester: pytest.Pytester, **env: str) -> pytest.RunResult:
    """A pytest run in a subprocess with the gate plugin, in `env` (the proc tree, ...)."""
    pytester.makepyfile(test_gate=GPU_TESTS)
    pytester.makeini("[pytest]\nmarkers =\n    gpu: needs a real NVIDIA GPU\n")
    with pytest.MonkeyPatch.context() as mp:
        for key, value in env.items():
            mp.setenv(key, value)
        return pytester.runpytest_subprocess("-p", "tests.gpu.gate", "-v")


@pytest.fixture
def gate_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    monkeypatch.delenv("GPULAUNCH_REQUIRE_GPU", raising=False)


def test_without_a_gpu_the_checks_are_not_applicable(
    pytester: pytest.Pytester, gate_env: None, tmp_path: Path
) -> None:
    res = run_gate(pytester, GPULAUNCH_GPU_PROC=str(tmp_path / "proc"))
    assert res.ret == 0
    res.assert_outcomes(passed=1, deselected=2)
    why = f"no NVIDIA GPU here (no {tmp_path}/proc/driver/nvidia, *)"
    res.stdout.fnmatch_lines([f"gpu: {why} — 2 GPU checks not applicable"])
    res.stdout.no_fnmatch_line("*SKIPPED*")
    res.stdout.no_fnmatch_line("*test_needs_a_gpu PASSED*")


def test_with_a_gpu_the_checks_run(
    pytester: pytest.Pytester, gate_env: None, tmp_path: Path
) -> None:
    (tmp_path / "proc/driver/nvidia/gpus/0000:18:00.0").mkdir(parents=True)
    res = run_gate(pytester, GPULAUNCH_GPU_PROC=str(tmp_path / "proc"))
    res.stdout.fnmatch_lines(["*test_needs_a_gpu PASSED*"])
    try:
        import pystemd.dbuslib  # noqa: F401
    except ImportError:
        res.assert_outcomes(passed=2, deselected=1)
        res.stdout.fnmatch_lines(["gpu: pystemd not installed * — 1 GPU check not applicable"])
    else:
        res.assert_outcomes(passed=3)


def test_a_required_gpu_that_is_missing_is_an_error(
    pytester: pytest.Pytester, gate_env: None, tmp_path: Path
) -> None:
    res = run_gate(pytester, GPULAUNCH_GPU_PROC=str(tmp_path / "proc"), GPULAUNCH_REQUIRE_GPU="1")
    assert res.ret == pytest.ExitCode.USAGE_ERROR
    res.stderr.fnmatch_lines(["*gpu: GPULAUNCH_REQUIRE_GPU=1 but no */driver/nvidia*"])


def test_findings_page() -> None:
    data = {
        "machine": {"gpus": "NVIDIA H200, 570.86, 143771 MiB", "cuda torch": "yes"},
        "checks": {
            "tests/gpu/test_jobs.py::test_gpu_memory_freed[sigterm]": {
                "outcome": "passed",
                "seconds": 9.5,
                "doc": "GPU memory is freed when the job ends.\n\nMore.",
            },
            "tests/gpu/test_inventory.py::test_numa": {
                "outcome": "failed",
                "seconds": 0.1,
                "doc": "",
                "why": ["AssertionError: 1 != 0"],
            },
        },
        "figures": {"tests/gpu/test_jobs.py::test_gpu_memory_freed[sigterm]": ["gone 0.21 s"]},
        "not_applicable": {"no CUDA torch": ["tests/gpu/test_jobs.py::test_two_ranks"]},
    }
    page = findings.render(data, ["pystemd: built from its sdist"])
    assert "- gpus: NVIDIA H200, 570.86, 143771 MiB" in page
    assert "- pystemd: built from its sdist" in page
    assert (
        "| `test_gpu_memory_freed[sigterm]` GPU memory is freed when the job ends. | passed "
        "| 9.5 | gone 0.21 s |" in page
    )
    assert "| failed: AssertionError: 1 != 0 |" in page
    assert "| `test_two_ranks` | not applicable: no CUDA torch | — | — |" in page


def test_script_cpu_only(tmp_path: Path) -> None:
    """scripts/test-gpu.sh --cpu-only, in this environment: collects every GPU check, runs
    none, says why, writes the findings page."""
    results = tmp_path / "gpu.md"
    env = {**os.environ, "GPU_VENV": sys.prefix, "GPU_RESULTS": str(results)}
    env.pop("GPULAUNCH_REQUIRE_GPU", None)
    res = subprocess.run(
        ["bash", "scripts/test-gpu.sh", "--cpu-only"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    assert "GPU checks not applicable" in res.stdout
    page = results.read_text()
    collected = int(res.stdout.split("collected ")[1].split()[0])
    assert collected >= 10
    assert page.count("| not applicable: no NVIDIA GPU here") == collected
    assert f"findings in {results}" in res.stderr


def test_exactly_one_of_the_pid_needs_is_met() -> None:
    """The GPU memory check compares with nvidia-smi only where the jobs' pids are the host's;
    elsewhere the "says so" check runs instead: one of the two, never neither."""
    from tests.gpu import gate

    met = [need for need in ("host-pids", "own-pid-namespace") if gate.PROBES[need]() is None]
    assert len(met) == 1, met
    from sdbox import host_systemd_running

    if not host_systemd_running():  # this machine's tests run in the box: nothing to compare
        assert met == ["own-pid-namespace"]
