"""Fuzz every option of `start`, `render`, `signal` and `setup` (issue 22 item 7).

A seeded generator (GPULAUNCH_FUZZ_SEED, default 22; GPULAUNCH_FUZZ_CASES per command)
builds command lines from each command's own parser, so a new option is fuzzed without
a change here: every case must end with a documented exit code, never 70, no
traceback, and a refusal must be one line. Bounded: a few seconds per command.

`start` runs as a subprocess, under the direct supervisor (no systemd is needed or
touched) with a script that exits at once; the others run in this process. `setup`
always gets a --root (it would write into /etc).
"""

from __future__ import annotations

import argparse
import os
import random
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpulaunch import cli, errors

SEED = int(os.environ.get("GPULAUNCH_FUZZ_SEED", "22"))
CASES = int(os.environ.get("GPULAUNCH_FUZZ_CASES", "30"))

# The table of gpulaunch/errors.py: every code a command may end with.
DOCUMENTED = {int(m) for m in re.findall(r"^  (\d+) ", errors.__doc__ or "", re.M)} | {0}
assert {2, 3, 69, 70, 71} <= DOCUMENTED

# Values that broke gpulaunch before (issue 22 item 7, issue 13 item 10), and their kin.
NUMBERS = ["0", "1", "-1", "9" * 50, "4294967297", "2147483648", "100001", "1e308", "nan",
           "inf", "-inf", "0.001", "1.5", "0x10", " 1", "", "٣"]  # fmt: skip
TEXTS = ["", "-", "--", "x", "a" * 300, "\n", "a\nb", "x\x01y", "%n", "☃", "a b",
         os.fsdecode(b"\xff"), os.fsdecode(b"\xed\xa0\x80"), "0-99999999", "1:2", "0,,1",
         "[::1]:x", "[", "k=v,=", "USR1", "SIGKILL", "99999999999999999999"]  # fmt: skip
PATHS = ["{t}/file", "{t}/dir", "{t}/nowhere/deep", "{t}/" + "a" * 300, "{t}/link-to-nothing",
         "/proc", "/proc/1/x", "/etc/passwd/x", "{t}/" + os.fsdecode(b"\xff")]  # fmt: skip
POOL = NUMBERS + TEXTS + PATHS

# Options that fuzzing must not hand a working value: they would reach systemd, another
# node, or a real start of the front end's child.
LEFT_OUT = {"--frontend-child", "--system", "--user", "--detach", "-d", "--help", "-h"}
# A reachable rendezvous nobody serves is waited for (its timeout): not input to refuse.
UNREACHABLE = ["", "x", "nosuch.invalid:1", "[", "[::1]:x", "h:99999999", "9" * 20, "a" * 300]
PINNED = {
    "--supervisor": ["direct"],
    "--nnodes": ["0", "9" * 50, "x", "1:2", "1"],
    "--rdzv-endpoint": UNREACHABLE,
    "--master-addr": UNREACHABLE + ["127.0.0.1", "256.0.0.1", os.fsdecode(b"\xff")],
}


def _options(command: str) -> list[argparse.Action]:
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return [
        a
        for a in sub.choices[command]._actions
        if a.option_strings and not set(a.option_strings) & LEFT_OUT
    ]


def _value(rng: random.Random, action: argparse.Action) -> list[str]:
    flag = rng.choice(action.option_strings)
    if action.nargs == 0:
        return [flag]
    if flag in PINNED or action.option_strings[0] in PINNED:
        return [flag, rng.choice(PINNED.get(flag) or PINNED[action.option_strings[0]])]
    pool = POOL + [str(c) for c in action.choices or ()]
    return [flag, rng.choice(pool)]


def _cases(command: str, positional: list[list[str]]) -> Iterator[list[str]]:
    """`positional`: the choices for each positional argument."""
    rng = random.Random(f"{SEED}:{command}")
    options = _options(command)
    for _ in range(CASES):
        argv = [command]
        for action in rng.sample(options, min(len(options), rng.randint(1, 3))):
            argv += _value(rng, action)
        yield argv + [rng.choice(choices) for choices in positional]


def _tree(t: Path) -> None:
    (t / "file").write_text("x")
    (t / "dir").mkdir()
    (t / "link-to-nothing").symlink_to(t / "nowhere")
    (t / "hello.py").write_text("pass\n")


def _check(argv: list[str], code: object, err: str) -> None:
    shown = [os.fsencode(a) for a in argv]
    if argv[0] == "start" and " failed: rank " in err:  # the job ran: its rank's status
        return
    assert code in DOCUMENTED and code != 70, (shown, code, err)
    assert "Traceback" not in err and "was never retrieved" not in err, (shown, err)
    if code != 0:
        lines = [line for line in err.splitlines() if line.startswith("gpulaunch: error: ")]
        assert len(lines) == 1 and err.rstrip("\n").endswith(lines[0]), (shown, err)


def _in_process(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.main(argv)
    _, err = capsys.readouterr()
    _check(argv, exit_.value.code, err)


@pytest.fixture
def tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    _tree(tmp_path)
    monkeypatch.chdir(tmp_path)
    for name in ("SLURM_JOB_ID", "SLURM_JOBID"):
        monkeypatch.delenv(name, raising=False)
    return tmp_path


def _fill(argv: list[str], t: Path) -> list[str]:
    return [a.replace("{t}", str(t)) for a in argv]


def test_render(tree: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for argv in _cases("render", [["hello.py"]]):
        _in_process(_fill(argv, tree), capsys)


def test_signal(tree: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for argv in _cases("signal", [["no-such-job-fuzz", *TEXTS], ["USR1", *TEXTS]]):
        _in_process(_fill(argv, tree), capsys)


def test_setup(tree: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rng = random.Random(f"{SEED}:setup-root")
    roots = [*PATHS, "{t}/root", "{t}/root"]  # a good one too: it installs there
    (tree / "root").mkdir()
    for argv in _cases("setup", []):
        if "--root" not in argv:
            argv += ["--root", rng.choice(roots)]
        _in_process(_fill(argv, tree), capsys)


def test_start(tree: Path) -> None:
    env = {**os.environ, "DBUS_SYSTEM_BUS_ADDRESS": "unix:path=/nonexistent"}
    for argv in _cases("start", [["hello.py"]]):
        argv = _fill(argv, tree)
        if "--supervisor" not in argv:
            argv[1:1] = ["--supervisor", "direct"]
        done = subprocess.run(
            [sys.executable, "-m", "gpulaunch", *argv],
            capture_output=True,
            env=env,
            timeout=120,
            check=False,
        )
        _check(argv, done.returncode, done.stderr.decode(errors="replace"))


# Issue 22 item 7's list, each: (argv, exit code, text of the one line).
LISTED = [
    (["start", "--nproc", "9" * 50, "hello.py"], 2, "must be between 1 and 16384"),
    (["start", "--nproc", "4294967297", "hello.py"], 2, "must be between 1 and 16384"),
    (["start", "--nproc", "100001", "hello.py"], 2, "must be between 1 and 16384"),
    (["start", "--nnodes", "9" * 50, "hello.py"], 2, "--nnodes must be between 1 and 65536"),
    (["start", "--master-addr", os.fsdecode(b"\xff"), "hello.py"], 2, "not valid UTF-8"),
    (["start", "--master-addr", os.fsdecode(b"\xed\xa0\x80"), "hello.py"], 2, "not valid UTF-8"),
    (["start", "--units-dir", "{t}/" + "u" * 300, "hello.py"], 2, "File name too long"),
    (["start", "--log-dir", "{t}/" + "l" * 300, "hello.py"], 2, "File name too long"),
    (["start", "--gpus", "0-99999999", "hello.py"], 2, "GPU number 99999999 is too large"),
    (["start", "--hang-timeout", "0.001", "hello.py"], 2, "must be at least 1 second"),
    (["signal", "job", "USR1", "--rank", "2147483648"], 2, "between 0 and 2147483647"),
    (["setup", "--root", "{t}/file"], 2, "is not a directory"),
    (["setup", "--root", "/proc"], 2, "cannot install /proc/etc/"),
    (["setup", "--root", "{t}/blocked"], 2, "Is a directory"),
    (["setup", "--root", "{t}/blocked-dir"], 2, "File exists"),
    (["start", "--no-python", "./hello.sh", "x"], 2, "program ./hello.sh is not executable"),
]


@pytest.mark.parametrize(("argv", "code", "text"), LISTED)
def test_each_listed_input_is_one_line(tree: Path, argv: list[str], code: int, text: str) -> None:
    from gpulaunch.system.files import BUS_POLICY

    (tree / "hello.sh").write_text("#!/bin/sh\n")  # mode 644
    (tree / "blocked" / BUS_POLICY.target.lstrip("/")).mkdir(parents=True)  # target: a dir
    system_d = tree / "blocked-dir" / BUS_POLICY.target.lstrip("/")
    system_d.parent.parent.mkdir(parents=True)
    system_d.parent.write_text("")  # system.d: a file
    argv = _fill(argv, tree)
    if argv[0] == "start":
        argv[1:1] = ["--supervisor", "direct"]
    done = subprocess.run(
        [sys.executable, "-m", "gpulaunch", *argv], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == code, done.stderr
    assert done.stderr.startswith("gpulaunch: error: ") and done.stderr.count("\n") == 1
    assert text in done.stderr, done.stderr
