"""Fixtures shared by the unit tests."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def script(tmp_path: Path) -> Path:
    """A training script that exists (the plan checks), in a fresh directory."""
    path = tmp_path / "train.py"
    path.write_text("print('hi')\n")
    return path
