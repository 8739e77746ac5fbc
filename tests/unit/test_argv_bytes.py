"""Command lines that are not UTF-8, and a working directory that is gone (issue 22 item 7):
the script's arguments pass through as bytes; every other value is refused in one line."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpulaunch import cli
from gpulaunch.base.argtext import not_utf8, printable
from gpulaunch.frontend.argv import FLAG, pack_argv, unpack_argv
from gpulaunch.frontend.unit import watcher_argv

ODD = [os.fsdecode(b"caf\xe9"), os.fsdecode(b"\xed\xa0\x80"), "ok", "", "a b"]


def test_the_front_end_packs_bytes_that_are_not_utf8_and_the_watcher_unpacks_them() -> None:
    argv = watcher_argv("/py", ["start", "--nproc", "2", "train.py", *ODD], "j")
    assert argv[:8] == ["/py", "-m", "gpulaunch", "start", "--frontend-child", "--job", "j", FLAG]
    assert len(argv) == 9 and not any(not_utf8(a) for a in argv)  # D-Bus takes it
    assert unpack_argv(argv[3:]) == ["start", "--frontend-child", "--job", "j", "--nproc", "2",
                                     "train.py", *ODD]  # fmt: skip


def test_utf8_command_lines_stay_as_they_are() -> None:
    tail = ["--nproc", "2", "train.py", "☃"]
    assert pack_argv(tail) == tail
    assert unpack_argv(["start", *tail]) == ["start", *tail]
    # the flag in a user's own arguments is theirs
    assert unpack_argv(["start", "x.py", FLAG, "41"]) == ["start", "x.py", FLAG, "41"]


def test_printable_shows_the_bytes() -> None:
    assert printable(ODD[0]) == "caf\\xe9" and printable("☃") == "☃"


def test_render_shows_a_script_argument_that_is_not_utf8(
    script: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(script.parent)
    with pytest.raises(SystemExit) as exit_:
        cli.main(["render", "--job", "odd", script.name, *ODD])
    out, err = capsys.readouterr()
    assert exit_.value.code == 0, err
    assert "caf\\xe9 \\xed\\xa0\\x80 ok" in out


@pytest.mark.parametrize("option", ["--master-addr", "--job", "--memory-max", "--rdzv-id"])
def test_other_values_must_be_utf8(
    script: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], option: str
) -> None:
    monkeypatch.chdir(script.parent)
    with pytest.raises(SystemExit) as exit_:
        cli.main(["render", option, ODD[0], script.name])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1, err
    assert "is not valid UTF-8: caf\\xe9" in err


def test_an_error_line_stays_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_:
        cli.main(["render", "new\nline.py"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1 and "new\\nline.py" in err, err


def test_a_deleted_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()
    with pytest.raises(SystemExit) as exit_:
        cli.main(["render", "train.py"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1, err
    assert "cannot start in this working directory" in err
