"""The command line as a user meets it: messages, help, torchrun's options."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from gpulaunch import cli, options


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
        "79 ",
        "80 ",
    ):
        assert f"\n  {line}" in "\n" + codes, line


def torchrun_options() -> list[str]:
    """Every option string of the torchrun in this environment (torch 2.13)."""
    from torch.distributed.run import get_args_parser

    return [
        s for a in get_args_parser()._actions for s in a.option_strings if s not in ("-h", "--help")
    ]


def start_parser() -> argparse.ArgumentParser:
    sub = next(a for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    parser = sub.choices["start"]
    assert isinstance(parser, argparse.ArgumentParser)
    return parser


@pytest.mark.parametrize("option", torchrun_options())
def test_every_torchrun_option_is_taken_or_refused_with_a_hint(
    option: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    action = start_parser()._option_string_actions.get(option)
    assert action is not None, f"torchrun's {option} is unknown to gpulaunch start"
    if not isinstance(action, options._Refuse):
        return
    monkeypatch.chdir(tmp_path)
    code, _, err = run(["start", option, "1", "train.py"], capsys)
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith(
        f"gpulaunch: error: {option} is a torchrun option gpulaunch does not take; "
    )


@pytest.mark.parametrize(
    ("argv", "dest", "value"),
    [
        (["--log_dir", "logs"], "log_dir", Path("logs")),
        (["--shutdown-timeout", "5"], "grace", 5.0),
        (
            ["--rdzv-endpoint", "localhost:0", "--rdzv-backend", "c10d"],
            "rdzv_endpoint",
            "localhost:0",
        ),
    ],
)
def test_torchrun_spellings(argv: list[str], dest: str, value: object) -> None:
    args = cli.build_parser().parse_args(["start", *argv, "train.py"])
    assert getattr(args, dest) == value


@pytest.mark.parametrize("nnodes", ["2", "1:2"])
def test_standalone_with_several_nodes_is_refused(
    nnodes: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """issue 35: `--standalone --nnodes 2` waited for a second node: one line, exit 2."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("")
    code, _, err = run(["start", "--standalone", "--nnodes", nnodes, "train.py"], capsys)
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith(
        f"gpulaunch: error: --standalone is one node: it cannot be --nnodes {nnodes}"
    )


@pytest.mark.parametrize(
    ("argv", "meant"),
    [  # (the first word is named: the option, or the script)
        (["--nproc-per-node", "2", "x.py"], "gpulaunch start --nproc-per-node 2 x.py"),
        (["--debug", "--nproc=2", "x.py", "--lr", "3"], "gpulaunch start --nproc=2 x.py --lr 3"),
        (["train.py"], "gpulaunch start train.py"),
    ],
)
def test_a_forgotten_start_is_named(
    argv: list[str], meant: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """issue 35: torchrun's line without `start` said "invalid choice: '2'"."""
    code, _, err = run(argv, capsys)
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith("gpulaunch: error: '") and err.endswith(
        f"' is not a command; did you mean `{meant}`?\n"
    ), err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    ("argv", "nproc", "script", "rest"),
    [
        (["--nproc", "2", "train.py", "--preempt"], 2, "train.py", ["--preempt"]),
        (
            ["--nproc=2", "train.py", "--nproc", "9", "--pre"],
            2,
            "train.py",
            ["--nproc", "9", "--pre"],
        ),
        (["--nproc", "2", "-d", "--", "-x.py", "--help"], 2, "-x.py", ["--help"]),
        (["--nproc", "3", "--no-python", "train.py"], 3, "train.py", []),
        (["--nproc", "4", "--max-res", "1", "train.py", "-d"], 4, "train.py", ["-d"]),
    ],
)
def test_what_follows_the_script_is_the_scripts(
    argv: list[str], nproc: int, script: str, rest: list[str]
) -> None:
    """`start ... train.py --preempt` failed as "ambiguous option: --preempt could match
    --preempt-grace, ..." (tests/vm/test_termination.py found it): the script's words are
    its own, whatever they abbreviate of ours."""
    args = cli.build_parser().parse_args(["start", *argv])
    assert (args.nproc, args.script, args.args) == (nproc, script, rest)


def test_an_ambiguous_option_before_the_script_is_still_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    code, _, err = run(["start", "--preempt", "train.py"], capsys)
    assert code == 2 and err.count("\n") == 1 and "ambiguous option: --preempt" in err, err
