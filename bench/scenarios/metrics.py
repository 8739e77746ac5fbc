"""9. Metrics: what Prometheus scraping `--metrics-listen` every second costs the watcher.

8 sleeping ranks (bench/ranks/sleeper.py) under gpulaunch with `--metrics-listen
127.0.0.1:PORT`. Two windows of `footprint_job_s` each, after every rank stamped its
start and 1 s more: first nobody scrapes (the baseline), then a client scrapes
`/metrics` once a second as Prometheus does (one kept-alive HTTP/1.1 connection,
`Accept: application/openmetrics-text`, the body read whole). The cost is the job's
CPU (the schedstat of every thread of every process carrying the run's token: the
watcher, the direct supervisor's keeper, the log pumps, the sleeping ranks) over the
scraping window minus the baseline's, per second of wall time, as a share of one CPU;
the scraper's own CPU is not counted (Prometheus pays it). Target: under 1 % of one
CPU (issue 26 item 4).
"""

from __future__ import annotations

import http.client
import time

from bench import launchers, procs
from bench.context import Context
from bench.launchers import Launcher
from bench.stats import Judge, Metric, Summary

NPROC = 8
SETTLE_S = 1.0
TARGET = 1.0  # percent of one CPU
LAUNCHERS = (Launcher.SYSTEMD, Launcher.DIRECT)


def run(ctx: Context) -> list[Metric]:
    cost = Metric("9a", "watcher CPU of a 1/s scrape, 8 ranks", "% of a CPU", judge=_target())
    idle = Metric("9b", "watcher CPU, nobody scraping", "% of a CPU", digits=3)
    each = Metric("9c", "watcher CPU per scrape", "ms", digits=2)
    for rep in range(ctx.config.footprint_reps):
        for launcher in ctx.order(rep):
            got = _once(ctx, launcher)
            cost.add(launcher, got["scrape_percent"] if got else None)
            idle.add(launcher, got["idle_percent"] if got else None)
            each.add(launcher, got["ms_per_scrape"] if got else None)
            if got:
                extras = ", ".join(f"{k} {v:.4g}" for k, v in got.items())
                cost.notes.append(f"{launcher} run {rep + 1}: {extras}")
                ctx.say(f"9 metrics rep {rep + 1} {launcher}: {extras}")
    return [cost, idle, each]


def _target() -> Judge:
    def check(ours: Summary, theirs: Summary) -> str:
        m = ours.median
        if m is None:
            return "no verdict (no sample)"
        return f"{'met' if m < TARGET else 'MISSED'} {m:.3f} %"

    return Judge(f"under {TARGET:g} % of one CPU", check)


def _once(ctx: Context, launcher: Launcher) -> dict[str, float] | None:
    window = ctx.config.footprint_job_s
    d = ctx.run_dir("metrics")
    port = launchers.free_port()
    token = launchers.new_token("metrics")
    script = launchers.rank_script("sleeper")
    args = ["--dir", str(d), "--sleep", str(2 * window + 4 * SETTLE_S + 30)]
    argv = launchers.command(launcher, NPROC, script, args, token)
    at = argv.index("start") + 1
    argv[at:at] = ["--metrics-listen", f"127.0.0.1:{port}"]
    run = launchers.spawn(launcher, token, argv, ctx.scratch, False, ctx.launch_env)
    try:
        deadline = time.monotonic() + ctx.config.run_cap_s
        while len(procs.read_stamps(d, "ready")) < NPROC:
            if run.wait_exit(0.02) or time.monotonic() > deadline:
                ctx.problem(f"metrics ({launcher}): the ranks did not all start")
                return None
        run.wait_exit(SETTLE_S)
        job = procs.job_pids(token)
        a = _cpu(job)
        run.wait_exit(window)
        b = _cpu(job)
        scrapes, size = _scrape(port, window)
        c = _cpu(job)
        if run.exited_at is not None or scrapes == 0:
            ctx.problem(f"metrics ({launcher}): the watcher went away, or no scrape answered")
            return None
        idle = (b[1] - a[1]) / (b[0] - a[0])
        busy = (c[1] - b[1]) / (c[0] - b[0])
        return {
            "scrape_percent": max(0.0, busy - idle) * 100,
            "idle_percent": idle * 100,
            "ms_per_scrape": max(0.0, busy - idle) * (c[0] - b[0]) / scrapes * 1000,
            "processes": len(job),
            "scrapes": scrapes,
            "body_bytes": size,
        }
    finally:
        run.signal(15)
        run.wait_exit(30)
        ctx.finish(run, "metrics")


def _cpu(pids: list[int]) -> tuple[float, float]:
    """(time.time(), the CPU seconds of these processes' live threads so far)."""
    at = time.time()
    return at, sum(u.threads_cpu_s for u in map(procs.usage, pids) if u is not None)


def _scrape(port: int, seconds: float) -> tuple[int, int]:
    """Scrape once a second for `seconds` on one connection; (scrapes answered, body size)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    answered, size = 0, 0
    start = time.monotonic()
    try:
        for i in range(int(seconds)):
            time.sleep(max(0.0, start + i - time.monotonic()))
            conn.request(
                "GET", "/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"}
            )
            response = conn.getresponse()
            body = response.read()
            if response.status == 200 and body.endswith(b"# EOF\n"):
                answered += 1
                size = len(body)
        time.sleep(max(0.0, start + seconds - time.monotonic()))
    finally:
        conn.close()
    return answered, size
