"""One sd_notify datagram, read: the fields of the progress channel (docs/progress.md).

Pure. `KEY=VALUE` lines (sd_notify(3)); what is not ours or systemd's is ignored,
and a malformed value of ours makes the whole datagram say nothing of steps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gpulaunch.progress import CHECKPOINT, STEP, STEP_SECONDS, TOTAL

MAX_STATUS = 200  # characters of a STATUS= kept (it is one line of `gpulaunch status`)


@dataclass(frozen=True)
class Notice:
    """What one datagram said."""

    step: int | None = None
    total: int | None = None
    step_seconds: float | None = None  # the rank's own time of that step
    status: str | None = None
    checkpoint: int | None = None  # a checkpoint of this step is written (goodput)
    ready: bool = False
    watchdog: bool = False


def _count(text: str) -> int | None:
    try:
        value = int(text)
    except ValueError:
        return None
    return value if 0 <= value < 1 << 62 else None


def _seconds(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) and 0 <= value < 1e9 else None


def parse(data: bytes) -> Notice:
    """The fields of one datagram; unknown and malformed fields are left out."""
    fields: dict[str, str] = {}
    for line in data.decode("utf-8", "replace").split("\n"):
        key, sep, value = line.partition("=")
        if sep:
            fields[key] = value
    step = _count(fields[STEP]) if STEP in fields else None
    total = _count(fields[TOTAL]) if TOTAL in fields else None
    seconds = _seconds(fields[STEP_SECONDS]) if STEP_SECONDS in fields else None
    status = fields.get("STATUS")
    saved = _count(fields[CHECKPOINT]) if CHECKPOINT in fields else None
    return Notice(
        step=step,
        total=total if step is not None else None,
        step_seconds=seconds if step is not None else None,
        status=None if status is None else status[:MAX_STATUS],
        checkpoint=saved,
        ready=fields.get("READY") == "1",
        watchdog=fields.get("WATCHDOG") == "1",
    )
