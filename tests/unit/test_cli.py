"""The command line as a user meets it: messages, help, torchrun's options."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpulaunch import cli


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exit_:
        cli.main(argv)
    out, err = capsys.readouterr()
    code = exit_.value.code
    assert isinstance(code, int)
    return code, out, err


@pytest.mark.parametrize(
    "argv",
    [
        ["start", "--debug", "train.py"],  # --debug belongs before `start`
        ["start", "--nproc", "x", "--debug", "train.py"],
        ["--debug", "start", "--nproc", "x", "train.py"],  # a usage error needs no traceback
    ],
)
def test_usage_errors_are_one_line_even_with_debug(
    argv: list[str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("")
    code, _, err = run(argv, capsys)
    assert code == 2
    assert "Traceback" not in err and err.count("\n") == 1, err
    assert err.startswith("gpulaunch: error: ")


def test_debug_after_start_says_where_it_goes(capsys: pytest.CaptureFixture[str]) -> None:
    _, _, err = run(["start", "--debug", "train.py"], capsys)
    assert "gpulaunch --debug start" in err


def test_start_help_lists_the_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["start", "--help"], capsys)
    assert code == 0
    codes = out.split("exit status:\n", 1)[1]
    for line in (
        "0..255",
        "2 ",
        "3 ",
        "68 ",
        "69 ",
        "70 ",
        "71 ",
        "73 ",
        "75 ",
        "76 ",
        "77 ",
        "78 ",
    ):
        assert f"\n  {line}" in "\n" + codes, line
