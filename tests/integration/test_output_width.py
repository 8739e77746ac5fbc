"""Ranks get the width they really have on the terminal (issue 22, item 16): Rich's tables
(Lightning's model summary) fill COLUMNS less the `[N] ` prefix, so no line wraps."""

from __future__ import annotations

import fcntl
import os
import select
import struct
import subprocess
import termios

import pytest

from tests.integration.jobs import REPO, Job

pytestmark = pytest.mark.integration

# Sizes itself as Rich's Console does (rich/console.py, Console.size): COLUMNS, else the first
# of stdin, stdout, stderr that is a terminal (a rank's stdin is the user's terminal), then
# draws a bordered table of that width. (Rich itself is not a test dependency: installed, it
# would switch Lightning's tests to its progress bar.)
RICH_LIKE_TABLE = """
import os
width = int(os.environ["COLUMNS"]) if os.environ.get("COLUMNS", "").isdigit() else 0
for fd in (0, 1, 2):
    if width:
        break
    try:
        width = os.get_terminal_size(fd).columns
    except OSError:
        pass
print("COLUMNS=" + os.environ.get("COLUMNS", "unset"), flush=True)
print("+" + "-" * (width - 2) + "+")
print("|" + "model summary".center(width - 2) + "|")
print("+" + "-" * (width - 2) + "+", flush=True)
"""


def read_all(master: int, proc: subprocess.Popen[str]) -> bytes:
    """Everything the pty shows until the job ends."""
    shown = b""
    while True:
        ready, _, _ = select.select([master], [], [], 1.0)
        if ready:
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: every writer is gone
                break
            shown += data
        elif proc.poll() is not None:
            break
    return shown


def test_ranks_lines_fit_the_terminal_with_their_prefix(job: Job) -> None:
    script = job.dir / "table.py"
    script.write_text(RICH_LIKE_TABLE)
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 70, 0, 0))
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    env["NO_COLOR"] = "1"
    proc = job.box.popen(
        job.argv("--nproc", "2", script=str(script)),
        cwd=str(REPO),
        stdin=slave,
        stdout=slave,
        stderr=subprocess.PIPE,
        env=env,
    )
    os.close(slave)
    try:
        shown = read_all(master, proc)
        _, err = proc.communicate(timeout=120)
    finally:
        os.close(master)
    assert proc.returncode == 0, err
    lines = [line for line in shown.decode().replace("\r\n", "\n").split("\n") if line]
    ranks = [line for line in lines if line.startswith(("[0] ", "[1] "))]
    assert "[0] COLUMNS=66" in ranks and "[1] COLUMNS=66" in ranks, lines
    table = [line for line in ranks if "COLUMNS" not in line]
    assert table and all(len(line) <= 70 for line in table), lines
    # The table filled the width it was given: its border is exactly 66 wide.
    assert max(len(line) for line in table) == 70, lines
