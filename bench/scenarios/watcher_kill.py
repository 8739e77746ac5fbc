"""2. Watcher killed: SIGKILL to the launcher process while 4 ranks run (sleep).

Measured from the SIGKILL to the moment no process of the job is left. We wait at most
`kill_cap_s`; whatever is still there then is counted as orphans and killed by us.
For gpulaunch we also wait for systemd to forget the job's units.
"""

from __future__ import annotations

import signal
import time

from bench import launchers, procs
from bench.context import Context, fmt
from bench.launchers import Launcher
from bench.stats import Metric, below

UNITS_CAP_S = 5.0


def run(ctx: Context) -> list[Metric]:
    cfg = ctx.config
    gone = Metric("2", "watcher SIGKILL → no job process left", "s", digits=3)
    gone.missing_label = f"orphans left after {cfg.kill_cap_s:g} s"
    orphans: dict[Launcher, list[int]] = {launcher: [] for launcher in ctx.launchers}
    units_s: dict[Launcher, list[float | None]] = {}
    for rep in range(cfg.reps):
        for launcher in ctx.order(rep):
            gone_s, left, unit_s = _once(ctx, launcher)
            gone.add(launcher, gone_s)
            orphans[launcher].append(left)
            if launcher in (Launcher.SYSTEMD, Launcher.FRONTEND):
                units_s.setdefault(launcher, []).append(unit_s)
            ctx.say(
                f"2 watcher-kill rep {rep + 1}/{cfg.reps} {launcher}: all gone "
                f"{fmt(gone_s, 3)} s, orphans after the {cfg.kill_cap_s:g} s cap: {left}"
            )
    gone.judge = below(0.5, "s")
    gone.notes += _torchrun_orphans(orphans.get(Launcher.TORCHRUN, []), cfg.kill_cap_s)
    for launcher, counts in orphans.items():
        capped = sum(1 for c in counts if c)
        gone.notes.append(
            f"{launcher}: orphans left {cfg.kill_cap_s:g} s after the SIGKILL in {capped} of "
            f"{len(counts)} runs (counts per run: {counts}); we killed them afterwards"
        )
    for launcher, series in units_s.items():
        done = [u for u in series if u is not None]
        gone.notes.append(
            f"{launcher.label}: the job's units were gone from `systemctl list-units --all` "
            f"{fmt(max(done) if done else None, 2)} s after the last process at the latest; "
            f"units still listed after {UNITS_CAP_S:g} s in {series.count(None)} runs"
        )
    return [gone]


def _torchrun_orphans(counts: list[int], cap: float) -> list[str]:
    left = [c for c in counts if c]
    if not left:
        return []
    return [
        f"torchrun left {max(left)} orphans after {cap:g} s in {len(left)} of {len(counts)} runs"
    ]


def _once(ctx: Context, launcher: Launcher) -> tuple[float | None, int, float | None]:
    cfg = ctx.config
    d = ctx.run_dir("kill")
    args = ["--dir", str(d), "--sleep", "600"]
    run = ctx.start(launcher, cfg.kill_nproc, "sleeper", args, "kill")
    try:
        deadline = time.monotonic() + cfg.run_cap_s
        while len(procs.read_stamps(d, "ready")) < cfg.kill_nproc:
            if run.wait_exit(0.02) or time.monotonic() > deadline:
                ctx.problem(f"watcher-kill ({launcher}): the ranks did not all start")
                return None, 0, None
        time.sleep(0.2)  # let the launcher settle into its steady state
        killed_at = time.time()
        run.signal(signal.SIGKILL)
        run.wait_exit(cfg.run_cap_s)
        gone_at = procs.wait_gone(run.token, cfg.kill_cap_s)
        left = len(procs.job_pids(run.token)) if gone_at is None else 0
        unit_s = None
        if launcher in (Launcher.SYSTEMD, Launcher.FRONTEND):
            unit_s = launchers.wait_units_gone(run.token, UNITS_CAP_S, launcher)
        return (None if gone_at is None else gone_at - killed_at), left, unit_s
    finally:
        # Orphans after the cap are expected (torchrun): killing them is not a problem to report.
        ctx.finish(run, "watcher-kill", leftovers_expected=True)
