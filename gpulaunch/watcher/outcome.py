"""The job's report, from the ranks' exits and what else ended the job (DESIGN's rules)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from gpulaunch.base.protocol import NodeFailure, RoundEnd
from gpulaunch.errors import GpulaunchError
from gpulaunch.model import Cause, JobReport, JobSpec, Outcome, RankResult
from gpulaunch.watcher.ranks import Rank


def job_report(
    spec: JobSpec,
    ranks: Sequence[Rank],
    outcome: Outcome,
    *,
    interrupt: tuple[float, int] | None,
    interrupted_by: str | None = None,
    start_error: GpulaunchError | None,
    restarts: int,
    node_failure: NodeFailure | None,
    rounds: Sequence[RoundEnd] = (),
    rank_error: Callable[[int], tuple[str | None, str | None]],
    hang: str | None = None,
    stacks: str | None = None,
    recovery: str | None = None,
) -> JobReport:
    """The report: `outcome` (model.job_outcome, or recovery/'s), unless the job failed to
    start. `rank_error(rank)` gives the cause rank's own error and where it came from;
    `recovery` says why the ranks were not restarted."""
    results = []
    for r in ranks:
        text, source = (
            rank_error(r.spec.rank) if r.spec.rank == outcome.cause_rank else (None, None)
        )
        results.append(
            RankResult(
                rank=r.spec.rank,
                unit=r.unit,
                pid=r.child.pid if r.child is not None else None,
                exit=r.exit,
                error=text,
                error_source=source,
            )
        )
    return JobReport(
        job=spec.job,
        status=outcome.status if start_error is None else start_error.exit_code,
        cause=outcome.cause if start_error is None else Cause.START_FAILED,
        cause_rank=outcome.cause_rank,
        interrupt_signal=interrupt[1] if interrupt else None,
        interrupted_by=interrupted_by if outcome.cause is Cause.INTERRUPTED else None,
        ranks=tuple(results),
        error=None if start_error is None else start_error.message,
        restarts=restarts,
        layout=spec.layout,
        node_failure=node_failure,
        rounds=tuple(rounds),
        hang=hang,  # hung, or --dump-stacks at a failure: where the ranks were
        stacks=stacks,
        recovery=recovery,
    )
