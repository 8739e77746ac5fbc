"""^C while gpulaunch is still importing: exit 130, no traceback (issue 13, item 13)."""

from __future__ import annotations

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
    """`gpulaunch render ... | head -1`: no 'internal error', the status of a SIGPIPE."""
    (tmp_path / "train.py").write_text("print('training')\n")
    proc = subprocess.Popen(
        # 512 ranks: far more text than a pipe holds (64 KiB), so the writer is still writing
        # when the reader goes away, however fast it is
        [GPULAUNCH, "render", "--nproc", "512", "--job", "pipe", "train.py"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.readline().startswith("# gpulaunch-pipe")
    proc.stdout.close()  # the reader is gone: the rest of the 512 units' text cannot be written
    err = proc.stderr.read()
    assert proc.wait(timeout=60) == 141, err
    assert "internal error" not in err and "Traceback" not in err, err
