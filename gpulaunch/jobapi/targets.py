"""The ranks `top` and `status --resources` measure, from a job's view on the bus.

resources/sample.py measures pids and units and knows nothing of the job API; this is the
one place that turns a `JobView` into what it measures.
"""

from __future__ import annotations

from gpulaunch.jobapi.view import JobView
from gpulaunch.resources.sample import RankTarget

OLDER = "the job's watcher does not publish LastOutput (older gpulaunch)"
NOT_RECORDED = "a record file does not keep it (no bus here to ask the job's watcher)"


def targets(view: JobView) -> tuple[list[RankTarget], str | None]:
    """The ranks to look at, from the job's view; and why it lacks LastOutput, if it does.

    For `top` and `status --resources` (resources/sample.py measures pids and units).
    """
    known = len(view.last_output) == len(view.ranks)
    out = []
    for i, r in enumerate(view.ranks):
        stamp = view.last_output[i] if known else 0
        out.append(
            RankTarget(
                rank=r.rank,
                unit=r.unit,
                pid=r.pid,
                state=r.state,
                last_output=stamp / 1e6 if stamp else None,
                watcher_pid=view.watcher_pid,
            )
        )
    return out, None if known else NOT_RECORDED if view.from_record else OLDER
