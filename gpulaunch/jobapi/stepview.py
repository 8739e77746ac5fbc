"""What ranks said of their steps (gpulaunch/progress/) in `status` and `top`: their columns
(docs/progress.md). The bus's `Steps` and the JSON are rankview.py's.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from gpulaunch.jobapi.rankview import RankView
from gpulaunch.model import StepInfo, format_duration

STEP_HEADER = ("step", "steps/s", "last step", "eta")


def step_cells(steps: StepInfo | None, now: float | None = None) -> tuple[str, ...]:
    """A rank's columns in `status` and `top` (STEP_HEADER)."""
    if steps is None:
        return ("-", "-", "-", "-")
    now = time.monotonic() if now is None else now
    step = str(steps.step) if steps.total is None else f"{steps.step}/{steps.total}"
    if steps.straggler:
        step += " STRAGGLER"
    rate = "-" if steps.steps_per_second is None else f"{steps.steps_per_second:.3g}"
    eta = steps.eta_seconds()
    return (
        step,
        rate,
        format_duration(max(0.0, now - steps.at)) + " ago",
        "-" if eta is None else format_duration(eta),
    )


def status_lines(ranks: Sequence[RankView]) -> list[str]:
    """Each rank's last STATUS=, one line each."""
    return [f"rank {r.rank}: {r.status_text}" for r in ranks if r.status_text]


def final_steps(ranks: Sequence[RankView]) -> list[str]:
    """An ended job's steps in `status`, one line; [] where no rank reported any."""
    said = [r for r in ranks if r.steps is not None]
    if not said:
        return []
    words = []
    for r in said:
        assert r.steps is not None
        s = r.steps
        text = f"rank {r.rank} {s.step}" + ("" if s.total is None else f"/{s.total}")
        if s.straggled:
            text += f" (a straggler {s.straggled}x)"
        words.append(text)
    return ["steps: " + ", ".join(words)]
