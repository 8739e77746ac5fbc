"""The job as metric families: what `--metrics-listen` serves and `--metrics-textfile`
writes (docs/metrics.md lists them). Pure: the job, what its ranks use, the node, the time.

Every series has the labels `job`, `node` (this machine's host name) and, per rank,
`rank` (the global rank). A number nobody can tell here (no memory controller, no
NVML, a rank that reports no steps) has no series, never a 0.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from gpulaunch.metrics.exposition import Family, Kind, Labels, Sample
from gpulaunch.metrics.usage import RankUse
from gpulaunch.model import (
    PHASES,
    AttemptPhases,
    Goodput,
    JobProgress,
    Phase,
    RankProgress,
    RankSpec,
    RankState,
    StepInfo,
)


@dataclass(frozen=True)
class _Rank:
    """One rank's numbers: what it is and uses, and its steps (seen at `now`)."""

    rank: RankProgress
    use: RankUse
    now: float


_RankValue = Callable[[_Rank], float | None]


def _steps(get: Callable[[StepInfo, float], float | None]) -> _RankValue:
    """A value of the rank's steps (and the time now); None while it reports none."""
    return lambda r: None if r.rank.steps is None else get(r.rank.steps, r.now)


# name, kind, unit, help, value (None: no series for that rank)
_RANK_SERIES: tuple[tuple[str, Kind, str, str, _RankValue], ...] = (
    (
        "gpulaunch_rank_exit_status",
        Kind.GAUGE,
        "",
        "how the rank ended: its exit code, or 128+N for signal N",
        lambda r: None if r.rank.exit is None else r.rank.exit.status,
    ),
    (
        "gpulaunch_rank_cpu_seconds",
        Kind.COUNTER,
        "seconds",
        "CPU time of every process of the rank's unit (its cgroup's cpu.stat)",
        lambda r: r.use.cpu_seconds,
    ),
    (
        "gpulaunch_rank_memory_bytes",
        Kind.GAUGE,
        "bytes",
        "memory of the rank's unit (its cgroup's memory.current)",
        lambda r: r.use.memory,
    ),
    (
        "gpulaunch_rank_resident_memory_bytes",
        Kind.GAUGE,
        "bytes",
        "resident memory (RSS) of the processes of the rank's unit, summed",
        lambda r: r.use.rss,
    ),
    (
        "gpulaunch_rank_processes",
        Kind.GAUGE,
        "",
        "processes in the rank's unit (the rank, its children and its log pump)",
        lambda r: r.use.processes,
    ),
    (
        "gpulaunch_rank_gpu_memory_bytes",
        Kind.GAUGE,
        "bytes",
        "GPU memory held by the rank's processes (NVML)",
        lambda r: r.use.gpu_memory,
    ),
    (
        "gpulaunch_rank_gpu_utilization_ratio",
        Kind.GAUGE,
        "ratio",
        "SM utilisation of the rank's processes over NVML's last sample window (1: all)",
        lambda r: None if r.use.gpu_util is None else r.use.gpu_util / 100,
    ),
    (
        "gpulaunch_rank_step",
        Kind.GAUGE,
        "",
        "the last training step the rank reported (progress channel)",
        _steps(lambda s, _: s.step),
    ),
    (
        "gpulaunch_rank_steps_expected",
        Kind.GAUGE,
        "",
        "the steps the rank said it will take in all",
        _steps(lambda s, _: s.total),
    ),
    (
        "gpulaunch_rank_steps_per_second",
        Kind.GAUGE,
        "",
        "the rank's recent step rate",
        _steps(lambda s, _: s.steps_per_second),
    ),
    (
        "gpulaunch_rank_step_duration_seconds",
        Kind.GAUGE,
        "seconds",
        "the rank's recent mean time of one step",
        _steps(lambda s, _: s.step_seconds),
    ),
    (
        "gpulaunch_rank_last_step_age_seconds",
        Kind.GAUGE,
        "seconds",
        "seconds since the rank's last step report",
        _steps(lambda s, now: max(0.0, now - s.at)),
    ),
    (
        "gpulaunch_rank_eta_seconds",
        Kind.GAUGE,
        "seconds",
        "seconds until the rank's expected steps at its current rate",
        _steps(lambda s, _: s.eta_seconds()),
    ),
    (
        "gpulaunch_rank_straggler",
        Kind.GAUGE,
        "",
        "1 while the rank's step time stays above the others' (a straggler), else 0",
        _steps(lambda s, _: float(s.straggler)),
    ),
)


def families(
    job: JobProgress,
    uses: Mapping[int, RankUse],
    node: str,
    now: float,
    goodput: Goodput | None = None,
    phases: Sequence[AttemptPhases] = (),
) -> list[Family]:
    """The job's families at `now` (CLOCK_MONOTONIC, as `StepInfo.at`); `goodput`: the
    job's so far (None: no rank reported a step: no goodput series); `phases`: where each
    attempt's start went so far (progress/phases.py)."""
    base: Labels = (("job", job.spec.job), ("node", node))
    out = [
        Family(
            "gpulaunch_job",
            Kind.INFO,
            "the job on this node: its manager and world size",
            (
                Sample(
                    (
                        *base,
                        ("manager", job.spec.manager.value),
                        ("world_size", str(job.spec.world_size)),
                    ),
                    1,
                ),
            ),
        ),
        _stateset(
            "gpulaunch_job_phase", "the job's phase on this node", base, list(Phase), job.phase
        ),
        Family(
            "gpulaunch_job_restarts",
            Kind.COUNTER,
            "restarts of the whole gang so far (--max-restarts): the attempt is this plus one",
            (Sample(base, job.attempt),),
        ),
        Family(
            "gpulaunch_job_ranks",
            Kind.GAUGE,
            "ranks of the job on this node",
            (Sample(base, len(job.ranks)),),
        ),
    ]
    if goodput is not None:
        out += _goodput_families(base, goodput)
    out += _phase_families(base, phases)
    states = [
        s
        for r in job.ranks
        for s in _stateset(
            "gpulaunch_rank_state", "", _rank_labels(base, r), list(RankState), r.state
        ).samples
    ]
    out.append(Family("gpulaunch_rank_state", Kind.STATESET, "each rank's state", tuple(states)))
    ranks = [_Rank(r, uses.get(r.rank, RankUse()), now) for r in job.ranks]
    placed = {r.rank: _gpu_labels(r) for r in job.spec.ranks}
    for name, kind, unit, text, value in _RANK_SERIES:
        gpu = name in _GPU_SERIES  # joined with DCGM's series by these labels
        samples = tuple(
            Sample((*_rank_labels(base, r.rank), *(placed.get(r.rank.rank, ()) if gpu else ())), v)
            for r in ranks
            for v in [value(r)]
            if v is not None
        )
        if samples:
            out.append(Family(name, kind, text, samples, unit))
    return out


def _goodput_families(base: Labels, goodput: Goodput) -> list[Family]:
    """ETTR and its parts (gpulaunch/progress/goodput.py defines each, docs/progress.md)."""
    return [
        Family(
            "gpulaunch_job_goodput_ratio",
            Kind.GAUGE,
            "effective training time ratio (ETTR): time in steps kept over wall time (0-1)",
            (Sample(base, goodput.ratio),),
            "ratio",
        ),
        Family(
            "gpulaunch_job_productive_seconds",
            Kind.GAUGE,
            "time the ranks made steps that were kept, since the start line",
            (Sample(base, goodput.productive),),
            "seconds",
        ),
        Family(
            "gpulaunch_job_wall_seconds",
            Kind.GAUGE,
            "time since the job's start line (the end, once it ended)",
            (Sample(base, goodput.wall),),
            "seconds",
        ),
        Family(
            "gpulaunch_job_lost_seconds",
            Kind.COUNTER,
            "time lost to failures: steps redone since the last checkpoint, detection, stop "
            "and restart, summed",
            (Sample(base, goodput.lost),),
            "seconds",
        ),
        Family(
            "gpulaunch_job_failures",
            Kind.COUNTER,
            "failures that cost the job time (its attempts that stepped and failed)",
            (Sample(base, len(goodput.losses)),),
        ),
    ]


# The restart phase histogram's buckets (seconds since the failure seen); +Inf is added.
PHASE_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)


def _phase_families(base: Labels, phases: Sequence[AttemptPhases]) -> list[Family]:
    """The first attempt's phases (a gauge each) and the restarts' (a histogram per phase),
    docs/recovery.md, "Where the time goes"."""
    out = []
    first = [p for p in phases if p.since == "start"]
    if first:
        out.append(
            Family(
                "gpulaunch_start_phase_seconds",
                Kind.GAUGE,
                "the first attempt's phases: seconds from the start line to each",
                tuple(Sample((*base, ("phase", n)), v) for n, v in first[0].phases),
                "seconds",
            )
        )
    restarts = [p for p in phases if p.since == "failure"]
    samples: list[Sample] = []
    for name in PHASES:
        values = [v for p in restarts for n, v in p.phases if n == name]
        if not values:
            continue  # never seen: no series, never a 0
        labels = (*base, ("phase", name))
        for le in PHASE_BUCKETS:
            samples.append(
                Sample((*labels, ("le", str(le))), sum(v <= le for v in values), "_bucket")
            )
        samples.append(Sample((*labels, ("le", "+Inf")), len(values), "_bucket"))
        samples.append(Sample(labels, len(values), "_count"))
        samples.append(Sample(labels, sum(values), "_sum"))
    if samples:
        out.append(
            Family(
                "gpulaunch_restart_phase_seconds",
                Kind.HISTOGRAM,
                "each restart's phases: seconds from the failure seen to each",
                tuple(samples),
                "seconds",
            )
        )
    return out


# A rank's GPU series carry its GPU as dcgm-exporter labels it (`gpu`: the index, `UUID`),
# so that a query can join them with DCGM's (docs/metrics.md).
_GPU_SERIES = frozenset({"gpulaunch_rank_gpu_memory_bytes", "gpulaunch_rank_gpu_utilization_ratio"})


def _gpu_labels(rank: RankSpec) -> Labels:
    if rank.gpu is None:
        return ()
    visible = rank.env.get("CUDA_VISIBLE_DEVICES", "")  # the UUID where the plan knew it
    uuid = (("UUID", visible),) if visible.startswith("GPU-") and "," not in visible else ()
    return (("gpu", str(rank.gpu)), *uuid)


def _rank_labels(base: Labels, rank: RankProgress) -> Labels:
    return (*base, ("rank", str(rank.rank)))


def _stateset(
    name: str, text: str, labels: Labels, states: list[Phase] | list[RankState], now: object
) -> Family:
    samples = tuple(Sample((*labels, (name, s.value)), 1 if s is now else 0) for s in states)
    return Family(name, Kind.STATESET, text, samples)
