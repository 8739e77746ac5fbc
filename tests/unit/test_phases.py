"""Where each attempt's start went (gpulaunch/progress/phases.py): the phases from the
timeline on a fake clock, and where they are shown (record, JSON, bus, metrics, report)."""

from __future__ import annotations

import json
from dataclasses import replace

from gpulaunch.jobapi.record import fields, parse
from gpulaunch.jobapi.view import JobView
from gpulaunch.jobapi.wire import phases_from_wire, phases_wire
from gpulaunch.metrics.exposition import openmetrics, prometheus_text
from gpulaunch.metrics.series import families
from gpulaunch.model import (
    PHASES,
    AttemptPhases,
    Cause,
    JobProgress,
    JobReport,
    Phase,
    RankExit,
    RankProgress,
    StepInfo,
)
from gpulaunch.progress.goodput import AttemptTimes
from gpulaunch.progress.phases import attempt_phases
from gpulaunch.progress.timeline import Timeline
from gpulaunch.report import format_report, phase_lines
from tests.unit.fakes import Clock, attached_timeline, job_view, make_job, progress_rank, rank_exit


def _rank(n: int, first: float | None = None, ended: RankExit | None = None) -> RankProgress:
    steps = None if first is None else StepInfo(1, None, first, None, None, first_at=first)
    return progress_rank(n, steps, ended)


def test_the_timeline_times_each_phase_of_the_first_attempt_and_of_a_restart() -> None:
    spec, _ = make_job([["true"], ["true"]], max_restarts=1)
    clock = Clock()
    part, snap = attached_timeline(spec, clock)
    clock.t = 10.0
    part.created()  # the start line
    part.line(0)  # (before any attempt: not counted)
    part.before_attempt(0)
    snap(0, Phase.STARTING, _rank(0), _rank(1))
    clock.t = 10.5
    snap(0, Phase.RUNNING, _rank(0), _rank(1))  # every rank forked, its gate open
    clock.t = 11.0
    part.line(1)
    part.line(1)  # (its second line: the first counts)
    clock.t = 12.0
    part.line(0)  # every rank printed a line: 12.0
    snap(0, Phase.RUNNING, _rank(0, 13.0), _rank(1))  # one rank stepped: not yet every one
    snap(0, Phase.RUNNING, _rank(0, 13.0), _rank(1, 14.0))
    assert part.phases() == (
        AttemptPhases(
            0, "start", (("ranks_forked", 0.5), ("first_line", 2.0), ("first_step", 4.0))
        ),
    )
    # rank 1 fails at 20 (seen), rank 0 is stopped, gone at 21
    snap(0, Phase.STOPPING, _rank(0, 13.0), _rank(1, 14.0, rank_exit(1, 20.0)))
    clock.t = 21.0
    snap(
        0,
        Phase.STOPPING,
        _rank(0, 13.0, rank_exit(143, 21.0, True)),
        _rank(1, 14.0, rank_exit(1, 20.0)),
    )
    clock.t = 21.5
    snap(1, Phase.STARTING, _rank(0), _rank(1))
    part.before_attempt(1)
    part.line(0)  # a line of the new attempt's rank 0
    clock.t = 22.0
    snap(1, Phase.RUNNING, _rank(0), _rank(1))
    clock.t = 23.0
    part.line(1)
    snap(1, Phase.RUNNING, _rank(0, 24.0), _rank(1, 25.0))
    clock.t = 30.0
    report = part.complete(JobReport("t", 0, Cause.SUCCEEDED, None, None, restarts=1))
    restart = report.phases[1]
    assert restart == AttemptPhases(
        1,
        "failure",
        (
            ("failure_seen", 0.0),
            ("ranks_stopped", 1.0),
            ("ranks_forked", 2.0),
            ("first_line", 3.0),
            ("first_step", 5.0),
        ),
    )
    times = [t for _, t in restart.phases]
    assert times == sorted(times)  # in the order they happen
    text = format_report(report)
    assert "where each restart's time went, seconds since its failure was seen:" in text
    assert "RESTART  RANKS STOPPED  RANKS FORKED  FIRST LINE  FIRST STEP" in text
    assert "  1        1.00           2.00          3.00        5.00" in text


def test_a_phase_not_seen_is_absent_never_a_zero() -> None:
    silent = AttemptTimes(0, began=1.0, forked=2.0)  # no line, no step
    (first,) = attempt_phases(0.5, [silent])
    assert first.phases == (("ranks_forked", 1.5),)
    assert [n for n, _ in first.phases if n in ("first_line", "first_step")] == []
    assert phase_lines([first]) == []  # no restart: no table


def test_round_phases_are_named_in_order_and_kept_from_a_dict() -> None:
    assert (
        PHASES.index("failure_seen") < PHASES.index("round_opened") < PHASES.index("ranks_forked")
    )
    raw = {"attempt": 2, "since": "failure", "phases": {"first_step": 3.0, "round_opened": 1.0}}
    assert AttemptPhases.from_dict(raw).phases == (("round_opened", 1.0), ("first_step", 3.0))


RESTART = AttemptPhases(
    1, "failure", (("failure_seen", 0.0), ("ranks_stopped", 0.25), ("first_step", 3.5))
)
START = AttemptPhases(0, "start", (("ranks_forked", 0.5),))


def test_the_record_json_and_bus_carry_them() -> None:
    view = job_view(phases=(START, RESTART), restarts=1)
    entry = dict(fields(view, "m"))
    assert json.loads(entry["GPULAUNCH_PHASES"])[1]["phases"]["ranks_stopped"] == 0.25
    back = parse({**entry, "__REALTIME_TIMESTAMP": "1"})
    assert back.phases == (START, RESTART)
    assert back.to_json()["phases"][1] == {
        "attempt": 1,
        "since": "failure",
        "phases": {"failure_seen": 0.0, "ranks_stopped": 0.25, "first_step": 3.5},
    }
    assert "GPULAUNCH_PHASES" not in dict(fields(job_view(), "m"))
    assert phases_from_wire(phases_wire((START, RESTART))) == (START, RESTART)
    props = view.properties()
    assert JobView.from_properties({k: v for k, (_, v) in props.items()}).phases == (START, RESTART)
    assert back.report().phases == (START, RESTART)


def test_the_metrics_have_a_histogram_per_restart_phase() -> None:
    spec, _ = make_job([["true"]])
    job = JobProgress(spec, Phase.RUNNING, (), 1, 1)
    again = replace(RESTART, attempt=2, phases=(("failure_seen", 0.0), ("ranks_stopped", 2.0)))
    found = families(job, {}, "n", 0.0, None, (START, RESTART, again))
    text = prometheus_text(found)
    assert "# TYPE gpulaunch_restart_phase_seconds histogram" in text
    stopped = 'job="t",node="n",phase="ranks_stopped"'
    assert f'gpulaunch_restart_phase_seconds_bucket{{{stopped},le="0.25"}} 1' in text
    assert f'gpulaunch_restart_phase_seconds_bucket{{{stopped},le="2.5"}} 2' in text
    assert f'gpulaunch_restart_phase_seconds_bucket{{{stopped},le="+Inf"}} 2' in text
    assert f"gpulaunch_restart_phase_seconds_count{{{stopped}}} 2" in text
    assert f"gpulaunch_restart_phase_seconds_sum{{{stopped}}} 2.25" in text
    assert 'gpulaunch_start_phase_seconds{job="t",node="n",phase="ranks_forked"} 0.5' in text
    assert 'phase="round_opened"' not in text  # not seen: no series
    om = openmetrics(found)
    assert "# TYPE gpulaunch_restart_phase_seconds histogram" in om
    assert "# UNIT gpulaunch_restart_phase_seconds seconds" in om
    assert "phase_seconds" not in prometheus_text(families(job, {}, "n", 0.0))


def test_several_nodes_time_the_round_between_the_stop_and_the_fork() -> None:
    spec, _ = make_job([["true"]], max_restarts=1)
    clock = Clock()
    part = Timeline(clock)

    def snap(attempt: int, phase: Phase, *ranks: RankProgress) -> None:
        part.changed(JobProgress(spec, phase, ranks, attempt, 1), None)

    part.created()
    part.before_attempt(0)
    snap(0, Phase.RUNNING, _rank(0))
    clock.t = 5.0
    snap(0, Phase.STOPPING, _rank(0))  # another node failed: the gang stop began
    clock.t = 5.5
    snap(0, Phase.STOPPING, _rank(0, ended=rank_exit(143, 5.5, True)))
    part.round_opened()  # this node joins the next round
    clock.t = 7.0
    part.round_closed()  # every node met
    snap(1, Phase.STARTING, _rank(0))
    part.before_attempt(1)
    clock.t = 7.25
    snap(1, Phase.RUNNING, _rank(0))
    assert part.phases()[1].phases == (
        ("failure_seen", 0.0),
        ("ranks_stopped", 0.5),
        ("round_opened", 0.5),
        ("round_closed", 2.0),
        ("ranks_forked", 2.25),
    )
    text = "\n".join(phase_lines(part.phases()))
    assert "RESTART  RANKS STOPPED  ROUND OPENED  ROUND CLOSED  RANKS FORKED" in text
