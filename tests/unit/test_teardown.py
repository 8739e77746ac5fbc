"""A failing Lightning rank's end (gpulaunch/integrations/teardown.py): the status its
exception means, never a wait on its process group."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from gpulaunch.integrations.teardown import exit_status

PROBE = """
import sys
from gpulaunch.integrations import teardown
code = sys.argv[1]
exc = SystemExit(int(code)) if code.isdigit() else (
    SystemExit("bad config") if code == "text" else RuntimeError("boom"))
try:
    teardown.failing(exc)
finally:
    print("not reached", flush=True)
"""


@pytest.mark.parametrize(
    ("code", "status", "said"),
    [("7", 7, ""), ("text", 1, "bad config"), ("error", 1, "RuntimeError: boom")],
)
def test_a_failing_rank_ends_at_once_with_its_status(code: str, status: int, said: str) -> None:
    """No finally, no teardown, no destroy_process_group() that could wait for good."""
    env = {**os.environ, "GPULAUNCH_JOB": "j"}  # a rank gpulaunch started
    argv = [sys.executable, "-c", PROBE, code]
    res = subprocess.run(argv, capture_output=True, text=True, env=env)
    assert res.returncode == status, res.stderr
    assert "not reached" not in res.stdout
    assert said in res.stderr


def test_success_interrupts_and_other_processes_are_no_failure(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from gpulaunch.integrations import teardown

    monkeypatch.delenv("GPULAUNCH_JOB", raising=False)
    teardown.failing(RuntimeError("not a rank of ours"))  # returns: Python's way
    monkeypatch.setenv("GPULAUNCH_JOB", "j")

    teardown.failing(SystemExit(0))  # returns: Python's own exit goes on
    teardown.failing(SystemExit(None))
    teardown.failing(KeyboardInterrupt())
    assert exit_status(SystemExit(None)) == 0 and exit_status(SystemExit(256 + 3)) == 3
