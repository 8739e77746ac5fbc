"""Run one soak job: start it, do its outside action at its instant, see how it ended.

This is measurement code: it waits for stamps and for units to go away by polling, at a
short fixed interval, on purpose (bench/procs.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from bench import launchers, procs
from bench.launchers import Launcher, Run
from bench.soak.judge import End, Seen, parse_headline
from bench.soak.plan import RESTARTS, WATCHER_SIGNALS, Fault, JobPlan, Phase

RECORD_ID = "74b8d59289c14f16ad639b2abe1d2863"  # README: the record's MESSAGE_ID
POLL_S = 0.01


@dataclass(frozen=True)
class Bounds:
    hang_s: float = 60.0  # a job not ended this long after its start hangs
    settle_s: float = 10.0  # how long its units and processes may take to go after its end


def run_job(
    plan: JobPlan, scratch: Path, bounds: Bounds, env: Mapping[str, str]
) -> tuple[str, Seen, float]:
    """Run `plan` (`env`: e.g. PYTHONPATH of a snapshot); its job id, what was seen, how long."""
    stamps = scratch / f"job{plan.index}"
    stamps.mkdir()
    run = launchers.start(
        Launcher.SYSTEMD,
        plan.nproc,
        launchers.rank_script("soak"),
        ["--dir", str(stamps), *plan.rank_args()],
        "soak",
        scratch,
        extra_env=env,
    )
    t0 = time.monotonic()
    deadline = t0 + bounds.hang_s
    acted, action_rc = False, None
    try:
        if plan.phase is not None and _wait_instant(plan, run, stamps, t0, deadline):
            acted, action_rc = _act(plan, run, deadline, env)
        ended = run.wait_exit(max(deadline - time.monotonic(), 0.0))
    finally:
        if run.exited_at is None:
            run.proc.kill()
    took = time.monotonic() - t0
    stderr = launchers.stderr_text(run, scratch)
    headline = parse_headline(run.token, stderr)
    units, pids = _leftovers(run.token, bounds.settle_s)
    run.close()  # what is left is killed and stopped (counted above)
    seen = Seen(
        returncode=run.returncode if ended else None,
        stderr=stderr,
        headline=headline,
        # the watcher writes the record before its report: with a report, wait for it
        record=_record(run.token, bounds.settle_s if headline is not None else 0.0),
        leaked_units=tuple(units),
        leaked_procs=pids,
        acted=acted,
        action_rc=action_rc,
        rank_faulted=(stamps / f"fault.{plan.fault_rank}").exists(),
    )
    return run.token, seen, took


def _running(run: Run) -> bool:
    return not run.wait_exit(0)


def _wait_instant(plan: JobPlan, run: Run, stamps: Path, t0: float, deadline: float) -> bool:
    """Sleep until the plan's instant; False if the launcher ended first (or the deadline)."""
    if plan.phase is Phase.START_UP:
        at = t0 + plan.offset_s
    else:
        names = (
            [f"ready.{r}" for r in range(plan.nproc)]
            if plan.phase is Phase.RUNNING
            else [f"fault.{plan.fault_rank}"]
        )
        while not all((stamps / n).exists() for n in names):
            if not _running(run) or time.monotonic() > deadline:
                return False
            time.sleep(POLL_S)
        at = time.monotonic() + plan.offset_s
    while time.monotonic() < at:
        if not _running(run):
            return False
        time.sleep(min(POLL_S, max(at - time.monotonic(), 0.0)))
    return _running(run)


def _act(
    plan: JobPlan, run: Run, deadline: float, env: Mapping[str, str]
) -> tuple[bool, int | None]:
    """Do the outside action; (done, its command's exit status)."""
    if plan.fault in WATCHER_SIGNALS:
        run.signal(WATCHER_SIGNALS[plan.fault])
        return True, None
    if plan.fault is Fault.SLICE_STOP:
        argv = ["systemctl", "stop", f"gpulaunch-{run.token}.slice"]
    elif plan.fault is Fault.GPULAUNCH_STOP:
        argv = [str(launchers.BIN / "gpulaunch"), "stop", run.token]
    else:
        argv = ["systemctl", "restart", RESTARTS[plan.fault]]
    try:
        done = subprocess.run(
            argv,
            capture_output=True,
            env={**os.environ, **env},
            timeout=max(deadline - time.monotonic(), 1.0),
            check=False,
        )
    except subprocess.TimeoutExpired:
        return True, None
    return True, done.returncode


def _leftovers(token: str, settle_s: float) -> tuple[list[str], int]:
    """The job's units and processes still there `settle_s` after its end (at most)."""
    until = time.monotonic() + settle_s
    while True:
        units, pids = launchers.job_units(token), procs.job_pids(token)
        if (not units and not pids) or time.monotonic() > until:
            return units, len(pids)
        time.sleep(POLL_S * 5)


def _record(token: str, wait_s: float) -> End | None:
    """The job's journal record (docs/dbus.md), waiting up to `wait_s` for it to appear."""
    until = time.monotonic() + wait_s
    while True:
        out = subprocess.run(
            [
                "journalctl",
                "-o",
                "json",
                "--no-pager",
                f"MESSAGE_ID={RECORD_ID}",
                f"GPULAUNCH_JOB={token}",
            ],  # fmt: skip
            capture_output=True,
            text=True,
            check=False,
        ).stdout
        lines = [json.loads(line) for line in out.splitlines() if line.strip()]
        if lines:
            last = lines[-1]
            rank = last.get("GPULAUNCH_CAUSE_RANK")
            return End(
                int(last["GPULAUNCH_STATUS"]),
                str(last.get("GPULAUNCH_CAUSE")),
                int(rank) if rank not in (None, "") else None,
            )
        if time.monotonic() > until:
            return None
        time.sleep(POLL_S * 10)
