"""4. Footprint: the launcher process's peak RSS and CPU over a 30 s job of 4 sleeping ranks.

The launcher process is the one we start: gpulaunch's watcher, torchrun's agent. We
sample it: peak RSS (/proc/<pid>/status VmHWM), CPU of the whole job
(/proc/<pid>/stat utime+stime), and, summed over its threads, CPU in ns
(task/*/schedstat) and voluntary context switches, i.e. how often it went to sleep and
was woken (task/*/status): a launcher that polls wakes up at its interval. The "while
ranks sleep" window starts 1 s after every rank has stamped its start and ends 1 s
before the first rank's sleep ends; peak RSS and the whole job's CPU are from the last
sample before the launcher exits (sampled every 50 ms after the window). Helpers are
reported apart (notes): gpulaunch's per-rank log pumps (forks of the watcher, in the
rank scopes; their RSS counts pages shared with the watcher again, their PSS does not),
and the box's systemd, dbus-daemon and journald, which work for gpulaunch, not torchrun.
"""

from __future__ import annotations

import time
from pathlib import Path

from bench import procs
from bench.context import Context
from bench.launchers import Launcher, Run
from bench.stats import Judge, Metric, Summary, compared, ratio_at_most

SETTLE_S = 1.0
MARGIN_S = 1.0
FINAL_SAMPLE_S = 0.05
HELPERS = ("systemd", "dbus-daemon", "systemd-journal")  # comm is cut to 15 characters
NEAR_ZERO_PER_MIN = 0.06  # CPU s per minute of sleeping ranks: 1 ms/s, 0.1 % of one CPU
POLLING_PER_MIN = 6.0  # fewer wakeups than one per 10 s: no poll loop at any useful interval


def run(ctx: Context) -> list[Metric]:
    cfg = ctx.config
    rss = Metric("4a", "launcher peak RSS", "MiB", judge=ratio_at_most(0.2, "1/5"), digits=1)
    idle = Metric("4b", "launcher CPU while ranks sleep", "CPU s/min", judge=_near_zero(), digits=4)
    wakeups = Metric(
        "4c", "launcher wakeups while ranks sleep", "/min", judge=_no_polling(), digits=1
    )
    total = Metric("4d", "launcher CPU, whole job", "CPU s", judge=compared("CPU"))
    pss = Metric(
        "4e", "launcher + its helper processes, PSS", "MiB", judge=compared("memory"), digits=1
    )
    for rep in range(cfg.footprint_reps):
        for launcher in ctx.order(rep):
            sample = _once(ctx, launcher)
            if sample is None:
                for m in (rss, idle, wakeups, total, pss):
                    m.add(launcher, None)
                continue
            rss.add(launcher, sample["hwm_mib"])
            idle.add(launcher, sample["idle_cpu_s_per_min"])
            wakeups.add(launcher, sample["idle_wakeups_per_min"])
            total.add(launcher, sample["total_cpu_s"])
            pss.add(launcher, sample["launcher_and_helpers_pss_mib"])
            extras = ", ".join(f"{k} {v:.3g}" for k, v in sample.items())
            idle.notes.append(f"{launcher} run {rep + 1}: {extras}")
            ctx.say(f"4 footprint rep {rep + 1}/{cfg.footprint_reps} {launcher}: {extras}")
    return [rss, idle, wakeups, total, pss]


def _near_zero() -> Judge:
    def check(ours: Summary, theirs: Summary) -> str:
        m = ours.median
        if m is None:
            return "no verdict (no sample)"
        return f"{'met' if m <= NEAR_ZERO_PER_MIN else 'MISSED'} {m * 1000:.1f} CPU ms/min"

    return Judge(f"target near zero, ≤ {NEAR_ZERO_PER_MIN:g} CPU s/min", check)


def _no_polling() -> Judge:
    def check(ours: Summary, theirs: Summary) -> str:
        m = ours.median
        if m is None:
            return "no verdict (no sample)"
        return f"{'met' if m <= POLLING_PER_MIN else 'MISSED'} {m:.1f}/min"

    return Judge(f"no polling, ≤ {POLLING_PER_MIN:g} wakeups/min", check)


def _once(ctx: Context, launcher: Launcher) -> dict[str, float] | None:
    cfg = ctx.config
    d = ctx.run_dir("footprint")
    args = ["--dir", str(d), "--sleep", str(cfg.footprint_job_s)]
    run = ctx.start(launcher, cfg.footprint_nproc, "sleeper", args, "foot")
    try:
        return _measure(ctx, run, d)
    finally:
        ctx.finish(run, "footprint")


def _measure(ctx: Context, run: Run, d: Path) -> dict[str, float] | None:
    cfg = ctx.config
    deadline = time.monotonic() + cfg.run_cap_s
    while len(procs.read_stamps(d, "ready")) < cfg.footprint_nproc:
        if run.wait_exit(0.02) or time.monotonic() > deadline:
            ctx.problem(f"footprint ({run.launcher}): the ranks did not all start")
            return None
    # The window: from SETTLE_S after the last rank started to MARGIN_S before the first ends.
    window_end = min(procs.read_stamps(d, "ready").values()) + cfg.footprint_job_s - MARGIN_S
    run.wait_exit(SETTLE_S)
    helpers = procs.pids_by_comm(*HELPERS)
    pumps = _forks_of_launcher(run)
    first = procs.usage(run.pid)
    pumps_0 = [u for u in map(procs.usage, pumps) if u is not None]
    helpers_0 = procs.cpu_of(helpers)
    if run.wait_exit(max(window_end - time.time(), 0)):
        ctx.problem(f"footprint ({run.launcher}): exited before its ranks ended")
        return None
    last = procs.usage(run.pid)
    pss = [procs.pss_kib(pid) or 0 for pid in (run.pid, *pumps)]
    pumps_1 = [u for u in map(procs.usage, pumps) if u is not None]
    helpers_1 = procs.cpu_of(helpers)
    final = last
    while not run.wait_exit(FINAL_SAMPLE_S):  # the whole job: the last sample before the exit
        final = procs.usage(run.pid) or final
        if time.monotonic() > deadline:
            break
    run.wait_exit(cfg.run_cap_s)
    ctx.check_status(run, "footprint", {0})
    if first is None or last is None or final is None or last.at - first.at < 1:
        ctx.problem(f"footprint ({run.launcher}): too few samples")
        return None
    minutes = (last.at - first.at) / 60
    return {
        "hwm_mib": final.hwm_kib / 1024,
        "rss_mib": last.rss_kib / 1024,
        "total_cpu_s": final.cpu_s,
        "idle_cpu_s_per_min": (last.threads_cpu_s - first.threads_cpu_s) / minutes,
        "idle_wakeups_per_min": (last.wakeups - first.wakeups) / minutes,
        "window_s": last.at - first.at,
        "helper_procs": len(pumps),
        "helpers_rss_mib_sum": sum(u.rss_kib for u in pumps_0) / 1024,
        "launcher_pss_mib": pss[0] / 1024,
        "launcher_and_helpers_pss_mib": sum(pss) / 1024,
        "helpers_idle_cpu_s_per_min": _sum(pumps_1, "threads_cpu_s", pumps_0) / minutes,
        "helpers_idle_wakeups_per_min": _sum(pumps_1, "wakeups", pumps_0) / minutes,
        "systemd_dbus_journald_cpu_s_per_min": (helpers_1 - helpers_0) / minutes,
    }


def _sum(after: list[procs.Usage], field: str, before: list[procs.Usage]) -> float:
    return float(sum(getattr(u, field) for u in after) - sum(getattr(u, field) for u in before))


def _forks_of_launcher(run: Run) -> list[int]:
    """Processes with the launcher's own command line (gpulaunch's log pumps)."""
    mine = procs.cmdline(run.pid)
    return [
        pid
        for pid in procs.job_pids(run.token, exclude=frozenset({run.pid}))
        if procs.cmdline(pid) == mine
    ]
