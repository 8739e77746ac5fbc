"""1. Failure propagation: one of 4 gloo DDP ranks raises in step 3 while the others wait.

Measured from the failing rank's last time stamp (taken right before it raises) to the
launcher's exit, and to the moment no process of the job is left (launcher included).
To tell the launcher's share from the rank's own, also: from the stamp to the moment
the failing rank's process is gone (its traceback and interpreter teardown; no launcher
can react before it), and from then to the launcher's exit.
"""

from __future__ import annotations

import time
from pathlib import Path

from bench import launchers, procs
from bench.context import Context, fmt
from bench.launchers import Launcher, Run
from bench.stats import Metric, compared, ratio_at_most

FAIL_RANK = 2
FAIL_STEP = 3
Times = dict[str, float | None]


def run(ctx: Context) -> list[Metric]:
    cfg = ctx.config
    metrics = {
        "exit": Metric("1a", "failure → launcher exit", "s", judge=ratio_at_most(1 / 3, "1/3")),
        "gone": Metric("1b", "failure → no job process left", "s", judge=compared("time")),
        "rank_gone": Metric(
            "1c", "failure → failing rank's process gone", "s", judge=compared("time")
        ),
        "reaction": Metric("1d", "failing rank gone → launcher exit", "s", judge=compared("time")),
    }
    for rep in range(cfg.reps):
        for launcher in launchers.order(rep):
            times = _once(ctx, launcher)
            for key, metric in metrics.items():
                metric.add(launcher, times.get(key))
            ctx.say(
                f"1 failure rep {rep + 1}/{cfg.reps} {launcher}: "
                + ", ".join(f"{k} {fmt(v)} s" for k, v in times.items())
            )
    return list(metrics.values())


def _once(ctx: Context, launcher: Launcher) -> Times:
    cfg = ctx.config
    d = ctx.run_dir("failure")
    args = ["--dir", str(d), "--fail-rank", str(FAIL_RANK), "--fail-step", str(FAIL_STEP)]
    run = ctx.start(launcher, cfg.failure_nproc, "ddp_fail", args, "fail")
    try:
        return _watch(ctx, run, d)
    finally:
        ctx.finish(run, "failure")


def _watch(ctx: Context, run: Run, d: Path) -> Times:
    deadline = time.monotonic() + ctx.config.run_cap_s
    stamp: tuple[float, int] | None = None
    rank_gone_at: float | None = None
    gone_at: float | None = None
    scanner = procs.JobScanner(run.token)
    while time.monotonic() < deadline:
        run.wait_exit(0.005)
        if stamp is None:
            stamp = procs.read_stamps_pids(d, "fail").get(FAIL_RANK)
            if stamp is None and run.exited_at is not None:
                ctx.problem(f"failure ({run.launcher}): exited before the rank failed")
                return {}
            continue
        now = time.time()
        if rank_gone_at is None and not procs.alive(stamp[1]):
            rank_gone_at = now
        if gone_at is None and not scanner.pids():
            gone_at = now
        if gone_at is not None and run.exited_at is not None and rank_gone_at is not None:
            break
    else:
        ctx.problem(f"failure ({run.launcher}): no end within {ctx.config.run_cap_s:g} s")
        return {}
    assert stamp is not None and run.exited_at is not None
    ctx.check_status(run, "failure", {1})
    failed_at = stamp[0]
    return {
        "exit": run.exited_at - failed_at,
        "gone": gone_at - failed_at,
        "rank_gone": rank_gone_at - failed_at,
        "reaction": run.exited_at - rank_gone_at,
    }
