"""3. Launch overhead: N ranks of a script that prints one line and exits (N = 8, 64).

Measured: the whole command's wall time (fork of the launcher to its exit), and the time
from the command's start to the moment the last rank's line reaches the reader of the
launcher's stdout (the "terminal": a pipe read by this process as lines arrive).
"""

from __future__ import annotations

import re

from bench.context import Context, fmt
from bench.launchers import Launcher, Run
from bench.stats import Metric, compared, ratio_at_most

HELLO = re.compile(rb"hello r=(\d+)$")


def run(ctx: Context) -> list[Metric]:
    cfg = ctx.config
    metrics = []
    for i, nproc in enumerate(cfg.launch_sizes):
        letter = "ab" if i == 0 else "cd"
        judge = ratio_at_most(0.5, "1/2") if i == 0 else compared("time")
        wall = Metric(f"3{letter[0]}", f"launch {nproc} ranks: wall time", "s", judge=judge)
        last = Metric(
            f"3{letter[1]}",
            f"launch {nproc} ranks: start → last rank's line",
            "s",
            judge=compared("time"),
        )
        for rep in range(cfg.reps):
            for launcher in ctx.order(rep):
                wall_s, last_s = _once(ctx, launcher, nproc)
                wall.add(launcher, wall_s)
                last.add(launcher, last_s)
                ctx.say(
                    f"3 launch {nproc} rep {rep + 1}/{cfg.reps} {launcher}: wall {fmt(wall_s)} s, "
                    f"last line {fmt(last_s)} s"
                )
        metrics += [wall, last]
    return metrics


def _once(ctx: Context, launcher: Launcher, nproc: int) -> tuple[float | None, float | None]:
    run = ctx.start(launcher, nproc, "hello", [], "hello", capture=True)
    try:
        if not run.drain(ctx.config.run_cap_s):
            ctx.problem(f"launch {nproc} ({launcher}): no end within {ctx.config.run_cap_s:g} s")
            return None, None
        ctx.check_status(run, f"launch {nproc}", {0})
        assert run.exited_at is not None
        first = first_lines(run)
        if len(first) != nproc:
            ctx.problem(f"launch {nproc} ({launcher}): lines of {len(first)} ranks, not {nproc}")
            return run.exited_at - run.started_at, None
        return run.exited_at - run.started_at, max(first.values()) - run.started_at
    finally:
        ctx.finish(run, f"launch {nproc}")


def first_lines(run: Run) -> dict[int, float]:
    """When each rank's first line arrived; a line may carry the launcher's prefix ("[3] ")."""
    first: dict[int, float] = {}
    partial = b""
    for at, chunk in run.chunks:
        lines = (partial + chunk).split(b"\n")
        partial = lines.pop()
        for line in lines:
            m = HELLO.search(line)
            if m is not None:
                first.setdefault(int(m.group(1)), at)
    return first
