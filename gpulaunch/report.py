"""How a `JobReport` reads in the terminal."""

from __future__ import annotations

from collections.abc import Sequence

from gpulaunch.base.protocol import Layout
from gpulaunch.model import (
    PHASES,
    AttemptPhases,
    Cause,
    Goodput,
    GpuUse,
    JobReport,
    RankResult,
    RankUsage,
    format_bytes,
    format_duration,
    signal_name,
)

# Installs packaging/journald/60-gpulaunch.conf (gpulaunch/system/setup.py).
# a cause rank's stderr tail that holds no Python traceback: its last lines, not "its error"
# (a library's warning may be all it printed; watcher/errorfile.py)
NO_TRACEBACK = "the last lines of its stderr, no traceback among them"
NO_STEP = "no rank stepped"  # how a hang by steps begins (watcher/hangwatch.py)
JOURNALD_FIX = "sudo gpulaunch setup --journald --restart-journald"


def count(n: int, noun: str) -> str:
    """`1 rank`, `4 ranks`, `1 time`."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def headline(report: JobReport) -> str:
    """One line: what happened to the job and its status."""
    if report.cause is Cause.SUCCEEDED:
        n = len(report.ranks)
        ranks = "its rank exited 0" if n == 1 else f"all {n} ranks exited 0"
        return f"gpulaunch: job {report.job} succeeded ({ranks})"
    if report.cause is Cause.INTERRUPTED:
        assert report.interrupt_signal is not None
        by = report.interrupted_by or signal_name(report.interrupt_signal)
        return f"gpulaunch: job {report.job} stopped by {by} (status {report.status})"
    if report.cause is Cause.HUNG and report.hang and report.hang.startswith(NO_STEP):
        # the ranks report steps (gpulaunch/progress/): they may well print and compute
        head = f"gpulaunch: job {report.job} hung (--hang-timeout, status {report.status})"
        return f"{head}: {report.hang}"
    if report.cause is Cause.HUNG:
        return (
            f"gpulaunch: job {report.job} hung: no output and no CPU use for --hang-timeout "
            f"(status {report.status})" + (f": {report.hang}" if report.hang else "")
        )
    if report.cause is Cause.TIME_LIMIT:
        return (
            f"gpulaunch: job {report.job} ran out of time: {report.interrupted_by} "
            f"(status {report.status}; not a failure)"
        )
    if report.cause is Cause.PREEMPTED:
        return f"gpulaunch: job {report.job} preempted (status {report.status}: requeue it)"
    if report.cause is Cause.START_FAILED:
        return f"gpulaunch: job {report.job} failed to start (status {report.status})"
    if report.cause is Cause.NODE_FAILED:
        assert report.node_failure is not None
        return (
            f"gpulaunch: job {report.job} stopped: {report.node_failure.describe()} "
            f"(status {report.status})"
        )
    if report.cause is Cause.REQUEUE:  # --max-requeues (gpulaunch/recovery/requeue.py)
        failed = next((r for r in report.ranks if r.rank == report.cause_rank and r.exit), None)
        what = f"rank {failed.rank} {failed.exit.describe()}" if failed and failed.exit else "hung"
        return (
            f"gpulaunch: job {report.job} failed: {what}; restarts spent here "
            f"(status {report.status}: requeue it)"
        )
    cause = next(r for r in report.ranks if r.rank == report.cause_rank)
    assert cause.exit is not None
    loop = " in a crash loop (--crash-loop)" if report.cause is Cause.CRASH_LOOP else ""
    return (
        f"gpulaunch: job {report.job} failed{loop}: rank {cause.rank} {cause.exit.describe()} "
        f"(status {report.status})"
    )


def nodes_line(layout: Layout) -> str:
    """`node 1 of 3; nodes: 0 hostA ranks 0-1, 1 hostB ranks 2-3, ...`"""
    nodes = ", ".join(
        f"{n.node} {n.host} ranks {n.first_rank}-{n.first_rank + n.nproc - 1}" for n in layout.nodes
    )
    return f"node {layout.node_rank} of {layout.nnodes}; nodes: {nodes}"


def _how(result: RankResult, report: JobReport) -> str:
    if result.exit is None:
        return "never started"
    if result.rank == report.cause_rank:
        return "cause"
    if result.exit.stopped_by_watcher:
        return "stopped"
    return "exited"


_USAGE_HEADERS = ("cpu", "peak mem", "gpu mem")


def _usage_cells(usage: RankUsage | None) -> tuple[str, str, str]:
    if usage is None:
        return ("-", "-", "-")
    return (
        "-" if usage.cpu_sec is None else format_duration(usage.cpu_sec),
        "-" if usage.peak_memory is None else format_bytes(usage.peak_memory),
        "-" if usage.gpu_memory is None else format_bytes(usage.gpu_memory),
    )


def usage_sources(report: JobReport) -> list[str]:
    """Where the usage columns come from, once (gpulaunch/watcher/final.py)."""
    usages = [r.exit.usage for r in report.ranks if r.exit and r.exit.usage]
    cpu = sorted({u.cpu_source for u in usages if u.cpu_source})
    peak = sorted({u.peak_source for u in usages if u.peak_source})
    if not cpu and not peak:
        return []
    return [f"  cpu: from {', '.join(cpu) or '-'}; peak mem: from {', '.join(peak) or '-'}"]


def format_table(rows: Sequence[Sequence[str]], indent: str = "") -> str:
    """Rows as left-aligned columns two spaces apart (the first row is the header)."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        indent + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    )


def _error_heading(r: RankResult) -> str:
    """`rank 1's error, from ...:`; a tail without a traceback is its last lines, no error."""
    if r.error_source != NO_TRACEBACK or r.exit is None:
        return f"rank {r.rank}'s error, from {r.error_source}:"
    how = f"exited {r.exit.code}" if r.exit.signal is None else r.exit.describe()
    return f"rank {r.rank} {how} without a traceback; its last lines of stderr:"


def format_report(report: JobReport) -> str:
    """The per-rank table, the cause rank first."""
    rows: list[tuple[str, ...]] = [("rank", "unit", "pid", "exit", "how", "runtime")]
    rows[0] += _USAGE_HEADERS
    ordered = sorted(report.ranks, key=lambda r: (r.rank != report.cause_rank, r.rank))
    usages = [r.exit.usage for r in ordered if r.exit and r.exit.usage]
    # the usage columns where some rank has them (a record of an older gpulaunch has none)
    shown = 6 + (2 if usages else 0) + (1 if any(u.gpu_memory is not None for u in usages) else 0)
    for r in ordered:
        rows.append(
            (
                str(r.rank),
                r.unit or "-",  # no unit: the direct supervisor
                str(r.pid) if r.pid is not None else "-",
                r.exit.describe() if r.exit else "-",
                _how(r, report),
                format_duration(r.exit.runtime) if r.exit else "-",
                *_usage_cells(r.exit.usage if r.exit else None),
            )
        )
    rows = [row[:shown] for row in rows]
    lines = [headline(report)]
    if report.layout is not None:
        lines.append("  " + nodes_line(report.layout))
        failure = report.node_failure
        if failure is not None and failure.node != report.layout.node_rank:
            if report.cause is not Cause.NODE_FAILED:  # e.g. this node was interrupted
                lines.append(f"  the job's first failure: {failure.describe()}")
        lines += [f"  {ended.describe()}; every node went on" for ended in report.rounds]
    lines += format_table(rows, indent="  ").splitlines()
    lines += usage_sources(report)
    if report.gpu_use is not None:
        lines += gpu_lines(report.gpu_use)
    earlier = report.carried is not None and report.carried.run > 0
    if report.restarts and not earlier:
        lines.append(
            f"gpulaunch: the ranks were restarted {count(report.restarts, 'time')} (--max-restarts)"
        )
    if earlier and report.carried is not None:  # a requeued Slurm job: attempts go on
        c = report.carried
        lines.append(
            f"gpulaunch: run {c.run + 1} of Slurm job {c.slurm_job} (requeued "
            f"{count(c.run, 'time')}): {count(c.attempts, 'attempt')} over its runs"
        )
    if report.restarts:
        lines += goodput_lines(report.goodput)
        lines += phase_lines(report.phases)
    if report.recovery:  # why they were not restarted (gpulaunch/recovery/)
        lines.append(report.recovery)
    for r in report.ranks:
        if r.error:
            lines.append(_error_heading(r))
            lines += ["  " + line for line in r.error.splitlines()]
    if report.hang and report.cause is not Cause.HUNG:  # --dump-stacks: the headline has not
        lines.append(f"where the other ranks were: {report.hang}")
    if report.stacks:
        lines.append("the ranks' stacks, innermost frame first:")
        lines += ["  " + line for line in report.stacks.splitlines()]
    failure = report.node_failure
    if report.cause is Cause.NODE_FAILED and failure is not None and failure.error:
        lines.append(
            f"rank {failure.rank}'s error (on node {failure.node}), from {failure.error_source}:"
        )
        lines += ["  " + line for line in failure.error.splitlines()]
    gaps = {gap.rank for gap in report.log_file_gaps}
    for drop in report.log_drops:
        kept = "the live view has" if drop.rank in gaps else "the live view and --log-dir have"
        if drop.unreachable:
            lines.append(
                f"gpulaunch: warning: journald missed {drop.written - drop.stored} of rank "
                f"{drop.rank}'s {drop.written} lines (it could not be reached for a while: "
                f"stopped or restarted); {kept} all of them"
            )
            continue
        if drop.crowded:
            lines.append(
                f"gpulaunch: warning: the journal lacks {drop.written - drop.stored} of rank "
                f"{drop.rank}'s {drop.written} lines (journald took them slower than the rank "
                f"wrote them{' and its rate limit' if drop.rate_limited else ''}; the rank was "
                f"not held back); {kept} all of them"
            )
            continue
        if not drop.rate_limited:
            lines.append(
                f"gpulaunch: warning: journald did not keep {drop.written - drop.stored} of rank "
                f"{drop.rank}'s {drop.written} lines (not its rate limit: its storage was full "
                f"or over SystemMaxUse=/RuntimeMaxUse=; see journalctl -u systemd-journald); "
                f"{kept} all of them"
            )
            continue
        lines.append(
            f"gpulaunch: warning: journald dropped {drop.written - drop.stored} of rank "
            f"{drop.rank}'s {drop.written} lines (its per-unit rate limit); {kept} all of them. "
            f"To keep every line in the journal: {JOURNALD_FIX}"
        )
    for gap in report.log_file_gaps:
        lines.append(
            f"gpulaunch: warning: {gap.path} lacks rank {gap.rank}'s lines after the first "
            f"{gap.lines_before} of {gap.lines_total} ({gap.error}); the live view and the "
            "journal have them"
        )
    return "\n".join(lines)


NO_STEPS = "goodput: no steps reported"  # never a made-up number (docs/progress.md)


def goodput_lines(goodput: Goodput | None) -> list[str]:
    """The job's goodput and what each failure cost; or that no rank reported a step."""
    if goodput is None:
        return [NO_STEPS]
    lines = [goodput.describe()]
    for loss in goodput.losses:
        restart = "not restarted" if loss.restart is None else f"restart {loss.restart:.2f}s"
        lines.append(
            f"  failure of attempt {loss.attempt + 1}: lost {loss.total:.2f}s (redone "
            f"{loss.redone:.2f}s, detection {loss.detection:.2f}s, stop {loss.stop:.2f}s, "
            f"{restart})"
        )
    if goodput.losses and not goodput.checkpoints:
        lines.append("  (no rank reported a checkpoint: a restart counts as starting over)")
    return lines


def phase_lines(phases: Sequence[AttemptPhases]) -> list[str]:
    """Where each restart's time went: a row per restart, a column per phase seen (the
    failure seen is their 0; docs/recovery.md, "Where the time goes")."""
    restarts = [p for p in phases if p.since == "failure"]
    names = [n for n in PHASES[1:] if any(n in dict(p.phases) for p in restarts)]
    if not names:
        return []
    rows = [["RESTART", *(n.replace("_", " ").upper() for n in names)]]
    for p in restarts:
        seen = dict(p.phases)
        rows.append([str(p.attempt), *(f"{seen[n]:.2f}" if n in seen else "-" for n in names)])
    return ["where each restart's time went, seconds since its failure was seen:"] + [
        format_table(rows, "  ")
    ]


def gpu_lines(use: GpuUse) -> list[str]:
    """A job's GPU accounting (leases/accounting.py); an XID beside the rank on that GPU."""
    energy = f", {use.energy_joules:.0f} J" if use.energy_joules is not None else ""
    lines = [f"GPU use: {use.gpu_seconds:.1f} GPU-seconds{energy}"]
    for r in use.ranks:
        parts = [f"rank {r.rank} on GPU {r.gpu}"]
        if r.peak_memory is not None:
            parts.append(f"peak {r.peak_memory / 2**30:.2f} GiB")
        if r.mean_utilisation is not None:
            parts.append(f"mean utilisation {r.mean_utilisation}%")
        if r.xids:
            parts.append(f"XID {', '.join(map(str, r.xids))} during the run (NVML event)")
        if len(parts) > 1:
            lines.append("  " + ", ".join(parts))
    return lines
