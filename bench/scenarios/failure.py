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

from bench import procs
from bench.context import Context, fmt
from bench.launchers import Launcher, Run
from bench.stats import Metric, below, compared, ratio_at_most

RECORD_DOC = """1r. Failure propagation with `@record`: scenario 1, the rank's entry point wrapped
in torch's `@record` (torch.distributed.elastic.multiprocessing.errors).

`@record` writes the exception to `$TORCHELASTIC_ERROR_FILE` before the interpreter
prints the traceback and tears down, so a launcher that watches the file can stop the
other ranks before the failing one has exited (gpulaunch/watcher/errorwatch.py);
torchrun reads the file only once the rank has exited. Targets (issue 17): every other
rank gone within 0.2 s of the error, and the launcher's exit at most 0.1 s after the
failing rank's own exit. Measured as in scenario 1, plus: from the stamp until every
other rank's process (pids from a stamp each rank writes once it joined the group) is
gone.
"""

FAIL_RANK = 2
FAIL_STEP = 3
Times = dict[str, float | None]


def run(ctx: Context) -> list[Metric]:
    metrics = {
        "exit": Metric("1a", "failure → launcher exit", "s", judge=ratio_at_most(1 / 3, "1/3")),
        "gone": Metric("1b", "failure → no job process left", "s", judge=compared("time")),
        "rank_gone": Metric(
            "1c", "failure → failing rank's process gone", "s", judge=compared("time")
        ),
        "reaction": Metric("1d", "failing rank gone → launcher exit", "s", judge=compared("time")),
        "others": Metric("1e", "failure → every other rank gone", "s", judge=compared("time")),
    }
    return _measure(ctx, metrics, record=False)


def run_record(ctx: Context) -> list[Metric]:
    metrics = {
        "exit": Metric("1ra", "@record: failure → launcher exit", "s", judge=compared("time")),
        "others": Metric(
            "1rb", "@record: failure → every other rank gone", "s", judge=below(0.2, "s")
        ),
        "rank_gone": Metric(
            "1rc", "@record: failure → failing rank's process gone", "s", judge=compared("time")
        ),
        "reaction": Metric(
            "1rd", "@record: failing rank gone → launcher exit", "s", judge=below(0.1, "s")
        ),
        "gone": Metric(
            "1re", "@record: failure → no job process left", "s", judge=compared("time")
        ),
    }
    return _measure(ctx, metrics, record=True)


def _measure(ctx: Context, metrics: dict[str, Metric], record: bool) -> list[Metric]:
    cfg = ctx.config
    name = "1r failure @record" if record else "1 failure"
    for rep in range(cfg.reps):
        for launcher in ctx.order(rep):
            times = _once(ctx, launcher, record)
            for key, metric in metrics.items():
                metric.add(launcher, times.get(key))
            ctx.say(
                f"{name} rep {rep + 1}/{cfg.reps} {launcher}: "
                + ", ".join(f"{k} {fmt(v)} s" for k, v in times.items())
            )
    return list(metrics.values())


def _once(ctx: Context, launcher: Launcher, record: bool) -> Times:
    cfg = ctx.config
    d = ctx.run_dir("failure")
    args = ["--dir", str(d), "--fail-rank", str(FAIL_RANK), "--fail-step", str(FAIL_STEP)]
    run = ctx.start(
        launcher, cfg.failure_nproc, "ddp_fail", [*args, *(["--record"] if record else [])], "fail"
    )
    try:
        return _watch(ctx, run, d)
    finally:
        ctx.finish(run, "failure @record" if record else "failure")


def _watch(ctx: Context, run: Run, d: Path) -> Times:
    deadline = time.monotonic() + ctx.config.run_cap_s
    stamp: tuple[float, int] | None = None
    others: list[int] = []
    rank_gone_at: float | None = None
    others_gone_at: float | None = None
    gone_at: float | None = None
    scanner = procs.JobScanner(run.token)
    while time.monotonic() < deadline:
        run.wait_exit(0.005)
        if stamp is None:
            stamp = procs.read_stamps_pids(d, "fail").get(FAIL_RANK)
            if stamp is None and run.exited_at is not None:
                ctx.problem(f"failure ({run.launcher}): exited before the rank failed")
                return {}
            if stamp is not None:  # every rank stamped "up" before the failing step
                up = procs.read_stamps_pids(d, "up")
                others = [pid for rank, (_, pid) in up.items() if rank != FAIL_RANK]
            continue
        now = time.time()
        if rank_gone_at is None and not procs.alive(stamp[1]):
            rank_gone_at = now
        if others_gone_at is None and not any(procs.alive(pid) for pid in others):
            others_gone_at = now
        if gone_at is None and not scanner.pids():
            gone_at = now
        if gone_at is not None and run.exited_at is not None and rank_gone_at is not None:
            break
    else:
        ctx.problem(f"failure ({run.launcher}): no end within {ctx.config.run_cap_s:g} s")
        return {}
    assert stamp is not None and run.exited_at is not None
    ctx.check_status(run, "failure", {1})
    if len(others) != ctx.config.failure_nproc - 1:
        ctx.problem(f"failure ({run.launcher}): {len(others)} other ranks stamped their pid")
    failed_at = stamp[0]
    return {
        "exit": run.exited_at - failed_at,
        "gone": gone_at - failed_at,
        "rank_gone": rank_gone_at - failed_at,
        "reaction": run.exited_at - rank_gone_at,
        "others": None if others_gone_at is None else others_gone_at - failed_at,
    }
