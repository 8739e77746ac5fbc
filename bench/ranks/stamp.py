"""Atomic time stamps from rank scripts: `<dir>/<name>.<rank>` holding `time.time() pid`."""

from __future__ import annotations

import os


def write_stamp(directory: str, name: str, rank: int, at: float) -> None:
    """Write the stamp under a hidden name first, so a reader never sees half of it."""
    tmp = os.path.join(directory, f".{name}.{rank}.tmp")
    with open(tmp, "w") as f:
        f.write(f"{at!r} {os.getpid()}")
    os.rename(tmp, os.path.join(directory, f"{name}.{rank}"))
