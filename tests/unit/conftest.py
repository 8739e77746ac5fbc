"""Fixtures shared by the unit tests."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture
def script(tmp_path: Path) -> Path:
    """A training script that exists (the plan checks), in a fresh directory."""
    path = tmp_path / "train.py"
    path.write_text("print('hi')\n")
    return path


@pytest.fixture
def wakeup() -> Iterator[tuple[int, socket.socket]]:
    """The watcher's wakeup fd (non-blocking read end) and the end a test signals through."""
    r, w = socket.socketpair()
    r.setblocking(False)
    yield r.fileno(), w
    r.close()
    w.close()
