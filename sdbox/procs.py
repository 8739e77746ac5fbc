"""Process helpers for sdbox: children of a process, and short bounded waits."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path


class WaitError(Exception):
    """A bounded wait gave up (the message says why)."""


def wait_until(done: Callable[[], bool], deadline: float, failed: Callable[[], str | None]) -> None:
    """Poll done() (a condition with no event to wait on) until the deadline.

    failed() returns a reason to give up early, e.g. "the box exited".
    """
    while not done():
        reason = failed()
        if reason is not None:
            raise WaitError(reason)
        if time.monotonic() > deadline:
            raise WaitError("timed out")
        time.sleep(0.002)


def children(pid: int) -> list[int]:
    """PIDs of pid's children ([] when it is gone); proc(5), the main thread's list."""
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def first_child(pid: int, alive: Callable[[], bool], timeout: float = 10.0) -> int:
    """The first child of pid, waiting for it to be forked while alive() holds."""
    found: list[int] = []

    def done() -> bool:
        found[:] = children(pid)
        return bool(found)

    def failed() -> str | None:
        return None if alive() else f"process {pid} exited before its child started"

    wait_until(done, time.monotonic() + timeout, failed)
    return found[0]


def cmdline(pid: int) -> bytes:
    """pid's command line as in /proc (b"" when it is gone)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""
