"""What the report says of rank output lost on its way: gaps in the --log-dir files and
the lines journald did not keep (its rate limit: docs/systemd-facts.md). Completed before
any part hears `finished`, so that the record and the bus carry the complete report."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import replace

from gpulaunch.logs.journal import LogDrop, rate_limit_burst, stored_lines
from gpulaunch.logs.journal import sync as journal_sync
from gpulaunch.logs.output import Output
from gpulaunch.model import JobReport, JobSpec
from gpulaunch.watcher.ranks import Rank


class LostOutput:
    """Made as the watcher is (the journal's lines since then are the job's)."""

    def __init__(self, spec: JobSpec, output: Output, journal: bool) -> None:
        self.spec = spec
        self.output = output
        self.journal = journal  # journald is reachable: count what it dropped
        self.since = time.time()

    def complete(
        self, report: JobReport, ranks: Sequence[Rank], pump_pids: Mapping[int, Sequence[int]]
    ) -> JobReport:
        report = replace(report, log_file_gaps=self.output.log_file_gaps)
        if not self.journal:
            return report
        missed = frozenset(r.spec.rank for r in ranks if r.journal_missed)
        crowded = frozenset(r.spec.rank for r in ranks if r.journal_crowded)
        # no units (the direct supervisor): the journal knows the ranks by their pumps
        writers = None if all(r.units for r in ranks) else pump_pids
        drops = journal_drops(self.spec, self.output, missed, self.since, crowded, writers)
        return replace(report, log_drops=drops)


def journal_drops(
    spec: JobSpec,
    output: Output,
    missed: frozenset[int] = frozenset(),
    since: float = 0.0,
    crowded: frozenset[int] = frozenset(),
    writers: Mapping[int, Sequence[int]] | None = None,
) -> tuple[LogDrop, ...]:
    """Ranks of which journald kept fewer lines than they wrote.

    Its rate limit, or it was away for a while (the pumps of the ranks in
    `missed` could not hand it every line), or it was slower than the rank (the pumps of
    the ranks in `crowded` left lines out rather than hold the rank back), or it did not
    store them.
    Every rank that wrote a line is counted (never a silent loss: with the rate
    limit lifted, journald can still fail to store or keep lines); only the lines
    since `since` (time.time() at the job's start), so that an earlier job of the
    same id does not count.
    """
    burst = rate_limit_burst()
    # empty lines are not counted: journald never stores them (logs/output.py journal_entries)
    wrote = [(r, output.journal_lines(r.rank)) for r in spec.ranks if output.journal_lines(r.rank)]
    if not wrote:
        return ()
    journal_sync(spec.manager)
    pids = None if writers is None else {f"rank{r}": p for r, p in writers.items()}
    stored = stored_lines(spec.manager, [(r.unit, f"rank{r.rank}") for r, _ in wrote], since, pids)
    if stored is None:
        return ()
    drops = []
    for rank, written in wrote:
        kept = stored[f"rank{rank.rank}"]
        if kept < written:
            limited = burst is not None and written > burst
            drops.append(
                LogDrop(
                    rank.rank, written, kept, rank.rank in missed, limited, rank.rank in crowded
                )
            )
    return tuple(drops)
