"""6. Scale: launch and gang-stop of 64 sleeping ranks.

Launch: from the command's start to the moment every rank process has exec'd the
rank's command line (`python -u SCRIPT ...`, seen in /proc, scanned every 20 ms: the
launcher's work is done, the interpreter's start begins), and to the moment the last
rank stamped its first statement (the rank script imports nothing before that, so its
imports are excluded, but the interpreter's own start with its `site` imports is
included). For reference, the same 64 interpreters started directly by this process
(`bare Popen loop`, no launcher) show what starting 64 Pythons costs on this machine.
The notes break the launch down: when the first and the last rank ran, and the CPU
that the launcher and the box's systemd, dbus-daemon and journald used meanwhile.

Stop: SIGTERM to the launcher (how a user or a scheduler stops a job), then the time to
the launcher's exit and to the moment no process of the job is left.
"""

from __future__ import annotations

import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from bench import launchers, procs
from bench.context import Context, fmt
from bench.launchers import Launcher, Run
from bench.stats import Metric, below, compared

POLL_S = 0.02  # /proc is scanned this often while ranks start: fine enough, and cheap
STOP_POLL_S = 0.005
STOP_STATUSES = {143, 1}  # gpulaunch: 128+SIGTERM; torchrun: 1 (SignalException)
HELPERS = ("systemd", "dbus-daemon", "systemd-journal")


@dataclass
class Launch:
    """One launch of the ranks, seconds from the command's start."""

    execd: float
    first: float  # the first rank's first statement
    last: float  # the last rank's
    launcher_cpu_s: float | None
    helpers_cpu_s: float


@dataclass
class Outcome:
    launch: Launch | None = None
    exit_s: float | None = None
    gone_s: float | None = None


def run(ctx: Context) -> list[Metric]:
    cfg = ctx.config
    n = cfg.scale_nproc
    execd = Metric("6a", f"{n} ranks: start → all exec'd", "s", judge=below(1.0, "s"))
    up = Metric("6b", f"{n} ranks: start → all ran their first line", "s", judge=below(1.0, "s"))
    stop_exit = Metric("6c", f"{n} ranks: stop → launcher exit", "s", judge=compared("time"))
    gone = Metric("6d", f"{n} ranks: stop → no job process left", "s", judge=compared("time"))
    launches: dict[Launcher, list[Launch]] = {launcher: [] for launcher in ctx.launchers}
    bare_execd: list[float | None] = []
    bare_up: list[float | None] = []
    for rep in range(cfg.reps):
        for launcher in ctx.order(rep):
            o = _once(ctx, launcher)
            execd.add(launcher, o.launch.execd if o.launch else None)
            up.add(launcher, o.launch.last if o.launch else None)
            stop_exit.add(launcher, o.exit_s)
            gone.add(launcher, o.gone_s)
            if o.launch is not None:
                launches[launcher].append(o.launch)
            ctx.say(
                f"6 scale rep {rep + 1}/{cfg.reps} {launcher}: "
                f"all exec'd {fmt(o.launch.execd if o.launch else None)} s, "
                f"all running {fmt(o.launch.last if o.launch else None)} s, "
                f"stop → exit {fmt(o.exit_s)} s, → all gone {fmt(o.gone_s)} s"
            )
        execd_s, up_s = _bare(ctx)
        bare_execd.append(execd_s)
        bare_up.append(up_s)
        ctx.say(
            f"6 scale rep {rep + 1}/{cfg.reps} bare Popen: all exec'd {fmt(execd_s)} s, "
            f"all running {fmt(up_s)} s"
        )
    execd.extra["bare Popen loop"] = bare_execd
    up.extra["bare Popen loop"] = bare_up
    up.notes += [_breakdown(launcher, runs, n) for launcher, runs in launches.items() if runs]
    return [execd, up, stop_exit, gone]


def _breakdown(launcher: Launcher, runs: list[Launch], n: int) -> str:
    def med(values: list[float | None]) -> str:
        present = [v for v in values if v is not None]
        return fmt(statistics.median(present)) if present else "-"

    first = med([r.first for r in runs])
    last = med([r.last for r in runs])
    pace = med([(r.last - r.first) / (n - 1) * 1000 for r in runs]) if n > 1 else "-"
    return (
        f"{launcher} (medians): first rank ran at {first} s, the last at {last} s "
        f"({pace} ms per further rank); CPU until then: launcher "
        f"{med([r.launcher_cpu_s for r in runs])} s, systemd+dbus+journald "
        f"{med([r.helpers_cpu_s for r in runs])} s"
    )


def _once(ctx: Context, launcher: Launcher) -> Outcome:
    cfg = ctx.config
    d = ctx.run_dir("scale")
    args = ["--dir", str(d), "--sleep", "600"]
    helpers = procs.pids_by_comm(*HELPERS)
    helpers_cpu = procs.cpu_of(helpers)
    run = ctx.start(launcher, cfg.scale_nproc, "sleeper", args, "scale")
    try:
        launch = _wait_up(ctx, run, d)
        if launch is None:
            return Outcome()
        launch.helpers_cpu_s = procs.cpu_of(helpers) - helpers_cpu
        stopped_at = time.time()
        run.signal(signal.SIGTERM)
        deadline = time.monotonic() + cfg.run_cap_s
        gone_at = None
        scanner = procs.JobScanner(run.token)
        while time.monotonic() < deadline and (gone_at is None or run.exited_at is None):
            run.wait_exit(STOP_POLL_S)
            if gone_at is None and not scanner.pids():
                gone_at = time.time()
        ctx.check_status(run, "scale", STOP_STATUSES)
        return Outcome(
            launch,
            None if run.exited_at is None else run.exited_at - stopped_at,
            None if gone_at is None else gone_at - stopped_at,
        )
    finally:
        ctx.finish(run, "scale")


def _wait_up(ctx: Context, run: Run, d: Path) -> Launch | None:
    """Wait until every rank has exec'd and stamped its first statement."""
    cfg = ctx.config
    deadline = time.monotonic() + cfg.run_cap_s
    script = launchers.rank_script("sleeper")
    execd_at = None
    while True:
        if execd_at is None and procs.exec_count(run.token, script) >= cfg.scale_nproc:
            execd_at = time.time()
        stamps = procs.read_stamps(d, "ready")
        if len(stamps) == cfg.scale_nproc:
            usage = procs.usage(run.pid)
            first, last = min(stamps.values()), max(stamps.values())
            # Every rank stamped before we saw the last exec: it exec'd by its stamp at the latest.
            execd_at = last if execd_at is None else min(execd_at, last)
            return Launch(
                execd=execd_at - run.started_at,
                first=first - run.started_at,
                last=last - run.started_at,
                launcher_cpu_s=None if usage is None else usage.cpu_s,
                helpers_cpu_s=0.0,
            )
        if run.wait_exit(POLL_S) or time.monotonic() > deadline:
            ctx.problem(f"scale ({run.launcher}): {len(stamps)} of {cfg.scale_nproc} ranks started")
            return None


def _bare(ctx: Context) -> tuple[float | None, float | None]:
    """The same ranks, started by a plain Popen loop: the cost of the interpreters alone."""
    n = ctx.config.scale_nproc
    d = ctx.run_dir("bare")
    token = launchers.new_token("bare")
    env = launchers.environment(token)
    script = launchers.rank_script("sleeper")
    argv = [sys.executable, "-u", script, "--dir", str(d), "--sleep", "600", "--token", token]
    started_at = time.time()
    children = []
    try:
        for rank in range(n):
            env["RANK"] = str(rank)
            children.append(subprocess.Popen(argv, env=dict(env), stdin=subprocess.DEVNULL))
        execd_s = time.time() - started_at  # Popen returns once the child has exec'd
        deadline = time.monotonic() + ctx.config.run_cap_s
        while len(stamps := procs.read_stamps(d, "ready")) < n:
            if time.monotonic() > deadline:
                ctx.problem(f"scale (bare): {len(stamps)} of {n} started")
                return execd_s, None
            time.sleep(POLL_S)
        return execd_s, max(stamps.values()) - started_at
    finally:
        for child in children:
            child.kill()
        for child in children:
            child.wait()
        procs.kill_token(token)
