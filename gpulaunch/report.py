"""How a `JobReport` reads in the terminal."""

from __future__ import annotations

from collections.abc import Sequence

from gpulaunch.model import Cause, JobReport, RankResult, format_duration, signal_name
from gpulaunch.multinode.protocol import Layout

JOURNALD_DROP_IN = "packaging/journald/60-gpulaunch.conf"


def headline(report: JobReport) -> str:
    """One line: what happened to the job and its status."""
    if report.cause is Cause.SUCCEEDED:
        return f"gpulaunch: job {report.job} succeeded (all {len(report.ranks)} ranks exited 0)"
    if report.cause is Cause.INTERRUPTED:
        assert report.interrupt_signal is not None
        by = report.interrupted_by or signal_name(report.interrupt_signal)
        return f"gpulaunch: job {report.job} stopped by {by} (status {report.status})"
    if report.cause is Cause.START_FAILED:
        return f"gpulaunch: job {report.job} failed to start (status {report.status})"
    if report.cause is Cause.NODE_FAILED:
        assert report.node_failure is not None
        return (
            f"gpulaunch: job {report.job} stopped: {report.node_failure.describe()} "
            f"(status {report.status})"
        )
    cause = next(r for r in report.ranks if r.rank == report.cause_rank)
    assert cause.exit is not None
    return (
        f"gpulaunch: job {report.job} failed: rank {cause.rank} {cause.exit.describe()} "
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


def format_table(rows: Sequence[Sequence[str]], indent: str = "") -> str:
    """Rows as left-aligned columns two spaces apart (the first row is the header)."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        indent + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    )


def format_report(report: JobReport) -> str:
    """The per-rank table, the cause rank first."""
    rows = [("rank", "unit", "pid", "exit", "how", "runtime")]
    ordered = sorted(report.ranks, key=lambda r: (r.rank != report.cause_rank, r.rank))
    for r in ordered:
        rows.append(
            (
                str(r.rank),
                r.unit,
                str(r.pid) if r.pid is not None else "-",
                r.exit.describe() if r.exit else "-",
                _how(r, report),
                format_duration(r.exit.runtime) if r.exit else "-",
            )
        )
    lines = [headline(report)]
    if report.layout is not None:
        lines.append("  " + nodes_line(report.layout))
        failure = report.node_failure
        if failure is not None and failure.node != report.layout.node_rank:
            if report.cause is not Cause.NODE_FAILED:  # e.g. this node was interrupted
                lines.append(f"  the job's first failure: {failure.describe()}")
    lines += format_table(rows, indent="  ").splitlines()
    if report.restarts:
        lines.append(
            f"gpulaunch: the ranks were restarted {report.restarts} time(s) (--max-restarts)"
        )
    for r in report.ranks:
        if r.error:
            lines.append(f"rank {r.rank}'s error, from {r.error_source}:")
            lines += ["  " + line for line in r.error.splitlines()]
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
        lines.append(
            f"gpulaunch: warning: journald dropped {drop.written - drop.stored} of rank "
            f"{drop.rank}'s {drop.written} lines (its per-unit rate limit); {kept} all of them. "
            f"To keep every line in the journal, install "
            f"{JOURNALD_DROP_IN} into /etc/systemd/journald.conf.d/ and restart systemd-journald"
        )
    for gap in report.log_file_gaps:
        lines.append(
            f"gpulaunch: warning: {gap.path} lacks rank {gap.rank}'s lines after the first "
            f"{gap.lines_before} of {gap.lines_total} ({gap.error}); the live view and the "
            "journal have them"
        )
    return "\n".join(lines)
