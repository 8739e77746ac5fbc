"""Bad input on the command line: one line, exit 2, nothing created (issue 13, item 10)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpulaunch import cli
from gpulaunch.errors import UsageError
from gpulaunch.logs.output import Output, OutputOptions, log_dir_problem
from gpulaunch.plan.spec import check_grace
from gpulaunch.units.templates import units_dir_problem


@pytest.mark.parametrize("seconds", [0, 0.001, 10, 1e9])
def test_grace_accepted(seconds: float) -> None:
    check_grace(seconds)


@pytest.mark.parametrize("seconds", [-1, float("nan"), float("inf"), -float("inf"), 1e308, 1e9 + 1])
def test_grace_refused(seconds: float) -> None:
    with pytest.raises(UsageError, match="--grace must be between 0 and 1000000000 seconds"):
        check_grace(seconds)


def _tree(tmp_path: Path) -> Path:
    (tmp_path / "file").write_text("x")
    (tmp_path / "dir").mkdir()
    (tmp_path / "locked").mkdir(mode=0o500)
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere" / "x")
    return tmp_path


@pytest.mark.parametrize(
    ("path", "problem"),
    [
        ("dir", None),
        ("new", None),
        ("new/deeper/still", None),
        ("dir/new", None),
        ("file", "{t}/file is not a directory"),
        ("file/sub", "{t}/file is not a directory"),
        ("dangling", "{t}/dangling is a symbolic link to nothing"),
    ],
)
def test_log_dir_problem(tmp_path: Path, path: str, problem: str | None) -> None:
    t = _tree(tmp_path)
    expected = problem.format(t=t) if problem else None
    assert log_dir_problem(t / path) == expected


def test_log_dir_in_proc_cannot_be_created() -> None:
    # /proc refuses new directories even to root
    assert log_dir_problem(Path("/proc/self/gpulaunch-logs")) is not None


def test_output_turns_a_failed_mkdir_into_a_usage_error(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(UsageError, match="cannot create --log-dir"):
        Output(OutputOptions(log_dir=tmp_path / "file"), 1)


@pytest.mark.parametrize(
    ("path", "problem"),
    [
        ("dir", None),
        ("new", "{t}/new does not exist"),
        ("file", "{t}/file is not a directory"),
        ("dangling", "{t}/dangling does not exist"),
    ],
)
def test_units_dir_problem(tmp_path: Path, path: str, problem: str | None) -> None:
    t = _tree(tmp_path)
    expected = problem.format(t=t) if problem else None
    assert units_dir_problem(t / path) == expected


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["render", "--grace", "nan"], "--grace must be between 0 and 1000000000 seconds, not nan"),
        (["render", "--grace", "1e308"], "--grace must be between"),
        (["render", "--units-dir", "/nonexistent"], "/nonexistent does not exist"),
        (["start", "--log-dir", "{t}/file"], "{t}/file is not a directory"),
        (["start", "--log-dir", "{t}/file/x"], "{t}/file is not a directory"),
        (["render", "--job", os.fsdecode(b"a\xffb")], "not valid UTF-8"),
    ],
)
def test_bad_input_is_one_line_exit_2(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    message: str,
) -> None:
    t = _tree(tmp_path)
    monkeypatch.chdir(t)
    (t / "train.py").write_text("")
    before = sorted(p.name for p in t.rglob("*"))
    with pytest.raises(SystemExit) as exit_:
        cli.main([a.format(t=t) for a in argv] + ["train.py"])
    out, err = capsys.readouterr()
    assert exit_.value.code == 2, err
    assert err.startswith("gpulaunch: error: ") and err.count("\n") == 1, err
    assert message.format(t=t) in err
    assert sorted(p.name for p in t.rglob("*")) == before
