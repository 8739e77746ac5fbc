"""5. Output volume: 4 ranks × 200,000 lines; wall time and lines delivered.

The "terminal" is a pipe on the launcher's stdout, read by this process as fast as
data comes. A line counts as delivered when it arrives whole (a launcher's prefix such
as "[3] " allowed). For gpulaunch we also count each rank's lines in the journal
(`journalctl -u gpulaunch-<JOB>-rank<N>.scope`): journald rate-limits per unit, so it
may keep fewer; "n/a" when none at all are attributed to the rank scopes. The CPU row
is wait4(2)'s rusage of the launcher: its own CPU plus that of every descendant it
reaped (the ranks; for gpulaunch also its per-rank log pumps). The ranks do the same
work under both launchers, so the difference is the launcher's output path; journald
works for gpulaunch too (its CPU is measured from /proc during the run, after the
journal count).
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass

from bench import launchers, procs
from bench.context import Context, fmt
from bench.launchers import Launcher, Run
from bench.machine import BOX_HELPERS
from bench.stats import Judge, Metric, Summary, compared, ratio_at_most

LINE = re.compile(rb"spew r=(\d+) i=\d{7} x{32}\.$", re.MULTILINE)
DROPPED = re.compile(r"journald dropped (\d+) of rank (\d+)'s (\d+) lines")


@dataclass
class Outcome:
    wall_s: float | None = None
    lines: float | None = None
    in_journal: float | None = None
    tree_cpu_s: float | None = None
    box_cpu_s: float | None = None  # the box's journald, systemd, dbus-daemon meanwhile
    said: str = ""  # what gpulaunch itself reported about journald's drops


def run(ctx: Context) -> list[Metric]:
    cfg = ctx.config
    expected = cfg.output_nproc * cfg.output_lines
    wall = Metric("5a", "output: wall time", "s", judge=ratio_at_most(1.0, "1×"))
    shown = Metric(
        "5b", "output: lines delivered to the terminal", "lines", judge=_no_loss(expected)
    )
    journal = Metric(
        "5c", "output: lines in the journal (gpulaunch systemd)", "lines", judge=_journal(expected)
    )
    cpu = Metric("5d", "output: CPU of launcher + ranks + helpers", "CPU s", judge=compared("CPU"))
    box_cpu = Metric(
        "5e", "output: CPU of journald, systemd, dbus meanwhile", "CPU s", judge=compared("CPU")
    )
    shown.digits = journal.digits = 0
    for rep in range(cfg.reps):
        for launcher in ctx.order(rep):
            o = _once(ctx, launcher)
            wall.add(launcher, o.wall_s)
            shown.add(launcher, o.lines)
            cpu.add(launcher, o.tree_cpu_s)
            box_cpu.add(launcher, o.box_cpu_s)
            if launcher is Launcher.SYSTEMD:
                journal.add(launcher, o.in_journal)
                if o.said and o.said not in journal.notes:
                    journal.notes.append(o.said)
            rate = f"{o.lines / o.wall_s:,.0f} lines/s" if o.wall_s and o.lines else "-"
            ctx.say(
                f"5 output rep {rep + 1}/{cfg.reps} {launcher}: wall {fmt(o.wall_s)} s, "
                f"terminal {fmt(o.lines, 0)}/{expected} lines ({rate}), "
                f"journal {fmt(o.in_journal, 0)}, CPU {fmt(o.tree_cpu_s)} s, "
                f"journald & co. {fmt(o.box_cpu_s)} s"
            )
    wall.notes.append(
        f"{cfg.output_nproc} ranks × {cfg.output_lines:,} lines of 54 bytes, written in "
        "PIPE_BUF-sized writes of whole lines"
    )
    return [wall, shown, journal, cpu, box_cpu]


def _no_loss(expected: int) -> Judge:
    def check(ours: Summary, theirs: Summary) -> str:
        if ours.low is None or ours.missing:
            return "no verdict (a run failed)"
        if ours.low == expected:
            return "met"
        return f"MISSED: as few as {ours.low:,.0f}"

    return Judge(f"target: all {expected:,} lines in every run", check)


def _journal(expected: int) -> Judge:
    def check(ours: Summary, theirs: Summary) -> str:
        if ours.median is None:
            return "n/a: no line attributed to the rank units"
        share = ours.median / expected
        if share >= 1:
            return "every line kept"
        return f"{share:.1%} of the lines kept (journald's per-unit rate limit)"

    return Judge("info", check)


def _once(ctx: Context, launcher: Launcher) -> Outcome:
    cfg = ctx.config
    args = ["--lines", str(cfg.output_lines)]
    box = procs.pids_by_comm(*BOX_HELPERS)
    box_cpu = procs.cpu_of(box)
    # torchrun --tee 3: rank-prefixed console output, as gpulaunch's live view
    run = ctx.start(launcher, cfg.output_nproc, "spew", args, "spew", capture=True, tee=True)
    try:
        if not run.drain(cfg.run_cap_s):
            ctx.problem(f"output ({launcher}): no end within {cfg.run_cap_s:g} s")
            return Outcome()
        ctx.check_status(run, "output", {0})
        assert run.exited_at is not None
        o = Outcome(
            wall_s=run.exited_at - run.started_at,
            lines=_count(run, cfg.output_nproc, cfg.output_lines, ctx),
            tree_cpu_s=run.tree_cpu_s,
            box_cpu_s=procs.cpu_of(box) - box_cpu,
        )
        if launcher is Launcher.SYSTEMD:
            o.in_journal = _journal_lines(run, cfg.output_nproc)
            o.said = _drops_said(run, ctx, o.in_journal)
        return o
    finally:
        run.chunks.clear()
        ctx.finish(run, "output")


def _count(run: Run, nproc: int, per_rank: int, ctx: Context) -> float:
    data = b"".join(chunk for _, chunk in run.chunks)
    counts = [0] * nproc
    for m in LINE.finditer(data):
        counts[int(m.group(1))] += 1
    if any(c != per_rank for c in counts):
        ctx.problem(f"output ({run.launcher}): lines per rank {counts}, expected {per_rank}")
    return float(sum(counts))


def _journal_lines(run: Run, nproc: int) -> float | None:
    subprocess.run(["journalctl", "--sync"], capture_output=True, check=False)
    total = 0
    for rank in range(nproc):
        unit = f"gpulaunch-{run.token}-rank{rank}.scope"
        out = subprocess.run(
            ["journalctl", "-q", "-u", unit, "-o", "cat", "--no-pager"],
            capture_output=True,
            check=False,
        ).stdout
        total += len(LINE.findall(out))
    return float(total) if total else None


def _drops_said(run: Run, ctx: Context, counted: float | None) -> str:
    """gpulaunch's own warning about journald's drops, checked against our count."""
    said = DROPPED.findall(launchers.stderr_tail(run, ctx.scratch, lines=50))
    if not said:
        return "gpulaunch reported no journald drop"
    kept = sum(int(total) - int(dropped) for dropped, _, total in said)
    agrees = "agrees with" if counted is not None and kept == counted else "differs from"
    return (
        f"gpulaunch warned that journald dropped lines of {len(said)} ranks; the lines kept "
        f"by its count ({kept:,}) {agrees} ours ({'-' if counted is None else f'{counted:,.0f}'})"
    )
