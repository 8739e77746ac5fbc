"""^C while gpulaunch is still importing: exit 130, no traceback (issue 13, item 13)."""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

GPULAUNCH = str(Path(sys.executable).with_name("gpulaunch"))

# Stands in for jinja2, which gpulaunch.cli imports: says it is being imported, then blocks.
SLOW_IMPORT = """
import sys, time
print("importing", flush=True)
time.sleep(600)
"""


@pytest.mark.parametrize(
    "command", [[GPULAUNCH, "--help"], [sys.executable, "-m", "gpulaunch", "--help"]]
)
def test_interrupt_during_imports_is_quiet(tmp_path: Path, command: list[str]) -> None:
    (tmp_path / "jinja2").mkdir()
    (tmp_path / "jinja2" / "__init__.py").write_text(SLOW_IMPORT)
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    proc = subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == "importing\n"  # gpulaunch is inside its imports
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
        proc.wait()
    assert (proc.returncode, out, err) == (130, "", "")


@pytest.mark.parametrize(
    ("command", "line"),
    [
        (
            [GPULAUNCH, "start", "--nproc", "1", "x.py"],
            "gpulaunch: stopped by SIGTERM before the job started (nothing was made)",
        ),
        ([GPULAUNCH, "--debug", "list"], "gpulaunch: stopped by SIGTERM"),
    ],
)
def test_sigterm_during_imports_says_it_in_one_line(
    tmp_path: Path, command: list[str], line: str
) -> None:
    """143 and one line, never silence (issue 22's soak: "report none for exit 143")."""
    (tmp_path / "jinja2").mkdir()
    (tmp_path / "jinja2" / "__init__.py").write_text(SLOW_IMPORT)
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    proc = subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == "importing\n"
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
        proc.wait()
    assert (proc.returncode, out, err) == (143, "", line + "\n")


AFTER_IMPORTS = """
import signal
from gpulaunch import cli
from gpulaunch.__main__ import main
cli.main = lambda: exit(0 if signal.getsignal(signal.SIGINT) is signal.default_int_handler else 1)
main()
"""


def test_interrupt_after_imports_is_a_keyboard_interrupt_again() -> None:
    # The commands that wait (wait, stop, a detached start) catch KeyboardInterrupt.
    res = subprocess.run([sys.executable, "-c", AFTER_IMPORTS], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr


def test_a_reader_that_goes_away_is_quiet(tmp_path: Path) -> None:
    """`gpulaunch render ... | head -1`: no 'internal error', the status of a SIGPIPE.

    The pipe is shrunk to one page, so that most of the output is still unwritten when
    the reader goes away: the broken pipe is certain, not a matter of timing.
    """
    (tmp_path / "train.py").write_text("print('training')\n")
    read_end, write_end = os.pipe()
    size = fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, 4096)
    try:
        proc = subprocess.Popen(
            [GPULAUNCH, "render", "--nproc", "64", "--job", "pipe", "train.py"],
            cwd=tmp_path,
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
        )
    finally:
        os.close(write_end)
    assert proc.stderr is not None
    first = b""
    while b"\n" not in first:  # unbuffered: take no more than the first line and a bit
        chunk = os.read(read_end, 64)
        assert chunk, proc.communicate()
        first += chunk
    assert first.startswith(b"# gpulaunch-pipe")
    os.close(read_end)  # the reader is gone: the rest of the 64 units' text cannot be written
    err = proc.stderr.read()
    assert proc.wait(timeout=60) == 141, err
    assert "internal error" not in err and "Traceback" not in err, err
    # Certain: render writes ~48 KiB, far more than the page the pipe held and what was read.
    assert size + len(first) < 40000
