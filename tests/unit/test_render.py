"""`gpulaunch render` for a 4-rank job with every resource option, against a snapshot.

The machine is a stand-in (tests/fake_machine.py: 4 GPUs on 2 NUMA nodes, 16 CPUs),
the job id and port are fixed, so the text is stable. After an intended change:

    GPULAUNCH_UPDATE_SNAPSHOTS=1 .venv/bin/python -m pytest tests/unit/test_render.py

and review the diff.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest

from gpulaunch import cli
from gpulaunch.units.codec import parse_unit
from gpulaunch.units.job import start_time
from gpulaunch.units.templates import SYSTEM_DIR, builtin_dir
from tests.fake_machine import four_gpu_machine

SNAPSHOT = Path(__file__).parent / "snapshots" / "render-4-ranks.txt"
UPDATE = os.environ.get("GPULAUNCH_UPDATE_SNAPSHOTS") == "1"
HEADER = re.compile(r"^# (\S+\.(?:slice|scope|service)) \(from (.+)\)$", re.M)


def render(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exit_:
        cli.main(["render", *argv])
    out, err = capsys.readouterr()
    assert exit_.value.code == 0, err
    return out


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    if SYSTEM_DIR.is_dir():
        pytest.skip(f"{SYSTEM_DIR} exists: its templates would change the snapshot")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    (tmp_path / "train.py").write_text("print('training')\n")
    four_gpu_machine(tmp_path / "machine")
    return tmp_path


def test_render_four_ranks_snapshot(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = render(
        [
            *("--job", "demo", "--master-port", "29500", "--grace", "30"),
            *("--gpus", "0-3", "--gpu-isolation", "--cpu-bind", "numa", "--memory-max", "12G"),
            *("--machine-root", str(workdir / "machine")),
            *("train.py", "--epochs", "3"),
        ],
        capsys,
    )
    # The anchor is rendered for this process, the one that would be the watcher.
    watcher = f'{os.getpid()} "{start_time(os.getpid())}"'
    assert watcher in out
    text = out.replace(str(builtin_dir()), "<units>").replace(watcher, '<pid> "<start time>"')
    text = text.replace(f'"{sys.executable}"', '"<python>"')
    if UPDATE:
        SNAPSHOT.write_text(text)
    assert text == SNAPSHOT.read_text(), f"{SNAPSHOT} differs; see the module docstring"
    names = HEADER.findall(out)
    assert [name for name, _ in names] == [
        "gpulaunch-demo.slice",
        "gpulaunch-demo-anchor.service",
        "gpulaunch-demo-watcher.scope",
        "gpulaunch-demo-ranks.slice",
        *(f"gpulaunch-demo-rank{r}.scope" for r in range(4)),
    ]


def test_render_output_is_what_the_codec_reads(
    workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each printed unit parses back into the properties `start` would send."""
    out = render(
        [
            *("--job", "demo", "--nproc", "2", "--cpus-per-rank", "3", "--gpu-isolation"),
            *("--machine-root", str(workdir / "machine"), "train.py"),
        ],
        capsys,
    )
    parts = HEADER.split(out)[1:]
    units = {name: (path, text) for name, path, text in zip(*[iter(parts)] * 3, strict=True)}
    rank1 = {
        p.name: p.value for p in parse_unit(units["gpulaunch-demo-rank1.scope"][1], "scope", "-")
    }
    assert rank1["Description"] == "gpulaunch job demo rank 1 (GPU 1)"
    assert rank1["AllowedCPUs"] == bytes([0b100, 0b110, 0, 0, 0, 0, 0, 0])  # 2,9-10
    assert rank1["DevicePolicy"] == "closed"
    assert rank1["DeviceAllow"][0] == ("/dev/char/195:1", "rw")  # type: ignore[index]
    assert "DevicePolicy" not in {
        p.name for p in parse_unit(units["gpulaunch-demo-watcher.scope"][1], "scope", "-")
    }


def test_job_memory_max_limits_the_job_slice(
    workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--job-memory-max: all ranks and the watcher together, MemoryMax= of the job slice."""
    out = render(["--job", "j", "--job-memory-max", "40G", "train.py"], capsys)
    headers = list(HEADER.finditer(out))
    texts = {
        m.group(1): out[m.end() : nxt.start() if nxt else len(out)]
        for m, nxt in zip(headers, [*headers[1:], None], strict=True)
    }
    assert "MemoryMax=40G" in texts["gpulaunch-j.slice"]
    assert [u for u, text in texts.items() if "MemoryMax" in text] == ["gpulaunch-j.slice"]


def test_bad_job_memory_max_is_an_option_error(
    workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.main(["render", "--job-memory-max", "lots", "train.py"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("gpulaunch: error: --job-memory-max lots:") and err.count("\n") == 1


def test_render_shows_the_front_ends_service_where_start_would_use_it(
    workdir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An ordinary user outside their user manager's tree: `start` runs the watcher as the
    front end's service (units/launch.service), and `render` prints it last."""
    import gpulaunch.frontend.need

    argv = ["render", "--user", "--supervisor", "systemd", "--job", "fe", "train.py", "x"]
    before = HEADER.findall(render(argv[1:], capsys))
    assert "gpulaunch-fe-launch.service" not in [name for name, _ in before]  # root: no

    monkeypatch.setattr(gpulaunch.frontend.need, "needs_frontend", lambda manager: True)
    monkeypatch.setenv("GL_RENDER_TEST", 'a "b"\n%c')
    out = render(argv[1:], capsys)
    names = [name for name, _ in HEADER.findall(out)]
    assert names[-1] == "gpulaunch-fe-launch.service", names
    text = out[out.index("# gpulaunch-fe-launch.service") :].split("\n", 1)[1]
    props = {p.name: p.value for p in parse_unit(text, "service", "-")}
    ((path, args, _),) = props["ExecStart"]  # type: ignore[misc]
    assert path == sys.executable
    assert args == [sys.executable, "-m", "gpulaunch", "start", "--frontend-child",
                    "--job", "fe", *argv[1:], ]  # fmt: skip
    assert 'GL_RENDER_TEST=a "b"\n%c' in props["Environment"]  # type: ignore[operator]
    assert props["WorkingDirectory"] == str(workdir)
    assert props["Type"] == "dbus" and str(props["BusName"]).endswith(f".p{os.getpid()}")
