"""Goodput (issue 39): the pure computation from a scripted timeline, the Part that keeps
the timeline from the watcher's snapshots on a fake clock, and where the result is shown
(the report, the record, the bus, `--json`, the metrics)."""

from __future__ import annotations

import json
import socket
from dataclasses import replace

import pytest

from gpulaunch import progress
from gpulaunch.jobapi.record import fields, parse
from gpulaunch.jobapi.view import JobView
from gpulaunch.jobapi.wire import goodput_from_wire, goodput_wire
from gpulaunch.metrics.exposition import prometheus_text
from gpulaunch.metrics.series import families
from gpulaunch.model import (
    Cause,
    Goodput,
    JobProgress,
    JobReport,
    Loss,
    Phase,
    StepInfo,
)
from gpulaunch.progress.goodput import AttemptTimes, goodput
from gpulaunch.progress.protocol import parse as parse_notice
from gpulaunch.progress.tracker import StepTracker
from gpulaunch.report import NO_STEPS, format_report, goodput_lines
from tests.unit.fakes import Clock, attached_timeline, job_view, make_job, progress_rank, rank_exit

# -- the computation -------------------------------------------------------------------


def test_a_job_that_never_failed_is_productive_from_its_first_step_to_its_last() -> None:
    g = goodput(100.0, 160.0, [AttemptTimes(0, 100.5, 110.0, 150.0, 140.0)], last_failed=False)
    assert g is not None
    assert (g.wall, g.productive, g.startup, g.losses) == (60.0, 40.0, 10.0, ())
    assert g.ratio == pytest.approx(40 / 60)


def test_a_failure_costs_its_redone_steps_detection_stop_and_restart() -> None:
    # start 0; attempt 0 steps 10..50, checkpoint at 40, failure seen 52, gone 55;
    # attempt 1 begins 56, steps 70..100, the job ends 103.
    attempts = [
        AttemptTimes(0, 1.0, 10.0, 50.0, checkpoint=40.0, failed=52.0, stopped=55.0),
        AttemptTimes(1, 56.0, 70.0, 100.0, checkpoint=90.0),
    ]
    g = goodput(0.0, 103.0, attempts, last_failed=False)
    assert g is not None
    assert g.losses == (Loss(0, redone=10.0, detection=2.0, stop=3.0, restart=15.0),)
    assert g.productive == 30.0 + 30.0
    assert g.lost == 30.0 == 70.0 - 40.0  # from the checkpoint to the next first step
    assert g.startup == 10.0
    # every second in exactly one part: the rest is the 3 s after the last step
    assert g.startup + g.productive + g.lost + 3.0 == g.wall == 103.0
    assert g.checkpoints


def test_without_a_checkpoint_every_step_of_a_failed_attempt_is_redone() -> None:
    attempts = [
        AttemptTimes(0, 0.0, 5.0, 25.0, failed=26.0, stopped=27.0),
        AttemptTimes(1, 27.5, 30.0, 40.0),
    ]
    g = goodput(0.0, 40.0, attempts, last_failed=False)
    assert g is not None and not g.checkpoints
    assert g.losses[0].redone == 20.0
    assert g.productive == 10.0
    assert "no rank reported a checkpoint" in "\n".join(goodput_lines(g))


def test_an_attempt_that_never_stepped_is_inside_the_restart_before_it() -> None:
    attempts = [
        AttemptTimes(0, 0.0, 2.0, 12.0, checkpoint=12.0, failed=13.0, stopped=14.0),
        AttemptTimes(1, 15.0, failed=16.0, stopped=17.0),  # died at import
        AttemptTimes(2, 18.0, 21.0, 31.0),
    ]
    g = goodput(0.0, 31.0, attempts, last_failed=False)
    assert g is not None
    assert g.losses == (Loss(0, 0.0, 1.0, 1.0, 7.0),)  # 14 -> 21: both restarts
    assert g.startup + g.productive + g.lost == g.wall


def test_a_job_that_ended_by_a_failure_loses_its_last_steps_and_has_no_restart() -> None:
    attempts = [AttemptTimes(0, 0.0, 1.0, 11.0, checkpoint=6.0, failed=11.5, stopped=12.0)]
    g = goodput(0.0, 12.5, attempts, last_failed=True)
    assert g is not None
    assert g.losses == (Loss(0, 5.0, 0.5, 0.5, None),)
    assert g.productive == 5.0
    assert "not restarted" in goodput_lines(g)[1]


def test_no_step_reported_is_no_goodput_never_a_number() -> None:
    assert goodput(0.0, 9.0, [AttemptTimes(0, 0.0, failed=3.0, stopped=4.0)], True) is None
    assert goodput(0.0, 9.0, [], False) is None
    assert goodput_lines(None) == [NO_STEPS] == ["goodput: no steps reported"]


# -- the rank side -----------------------------------------------------------------------


def test_checkpoint_is_one_sd_notify_field_and_is_read(monkeypatch: pytest.MonkeyPatch) -> None:
    from gpulaunch.progress import checkpoint  # the import path the issue names

    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as server:
        server.bind("")
        name = server.getsockname()
        assert isinstance(name, bytes)
        monkeypatch.setenv("NOTIFY_SOCKET", "@" + name[1:].decode())
        assert checkpoint(300)
        data = server.recv(4096)
    assert data == b"X_GPULAUNCH_CHECKPOINT=300"
    assert progress.CHECKPOINT == "X_GPULAUNCH_CHECKPOINT"
    assert parse_notice(data).checkpoint == 300
    assert parse_notice(b"X_GPULAUNCH_CHECKPOINT=-1").checkpoint is None


def test_a_tracker_keeps_its_first_step_and_last_checkpoint() -> None:
    t = StepTracker()
    t.report(1, None, 10.0)
    t.report(2, None, 11.0)
    t.saved(2, 11.5)
    t.report(1, None, 12.0)  # the loop started over: the window does, the first step not
    info = t.info()
    assert info is not None
    assert (info.first_at, info.checkpoint, info.checkpoint_at, info.at) == (10.0, 2, 11.5, 12.0)


# -- the Part, on a fake clock -----------------------------------------------------------


def _steps(first: float, at: float, saved: float | None = None) -> StepInfo:
    known = None if saved is None else 1
    return StepInfo(1, None, at, None, None, first_at=first, checkpoint=known, checkpoint_at=saved)


def test_the_timeline_follows_snapshots_through_a_restart() -> None:
    spec, _ = make_job([["true"], ["true"]], max_restarts=1)
    clock = Clock()
    part, snap = attached_timeline(spec, clock)
    clock.t = 1.0
    part.created()  # the start line
    clock.t = 2.0
    part.before_attempt(0)
    assert part.now() is None  # nothing stepped yet: no number
    clock.t = 20.0
    snap(
        0,
        Phase.RUNNING,
        progress_rank(0, _steps(5.0, 19.0, 15.0)),
        progress_rank(1, _steps(5.5, 19.5)),
    )
    running = part.now()
    assert running is not None and running.wall == 19.0 and running.productive == 14.5
    # rank 1 fails at 21, rank 0 is stopped, gone at 22
    saved, failed = (
        progress_rank(0, _steps(5.0, 19.0, 15.0)),
        progress_rank(1, _steps(5.5, 19.5), rank_exit(1, 21.0)),
    )
    snap(0, Phase.STOPPING, saved, failed)
    clock.t = 22.0
    snap(
        0,
        Phase.STOPPING,
        progress_rank(0, _steps(5.0, 19.0, 15.0), rank_exit(143, 22.0, stopped=True)),
        progress_rank(1, _steps(5.5, 19.5), rank_exit(1, 21.0)),
    )
    clock.t = 23.0
    snap(1, Phase.STARTING, progress_rank(0, None), progress_rank(1, None))
    part.before_attempt(1)
    clock.t = 40.0
    snap(
        1, Phase.RUNNING, progress_rank(0, _steps(30.0, 39.0)), progress_rank(1, _steps(30.0, 39.5))
    )
    clock.t = 41.0
    report = part.complete(JobReport("t", 0, Cause.SUCCEEDED, None, None, restarts=1))
    g = report.goodput
    assert g is not None
    assert g.losses == (Loss(0, redone=4.5, detection=1.5, stop=1.0, restart=8.0),)
    assert g.productive == pytest.approx(10.0 + 9.5)
    assert g.wall == 40.0 and g.startup == 4.0
    assert g.startup + g.productive + g.lost + (41.0 - 39.5) == pytest.approx(g.wall)
    assert part.now() is g  # ended: the final one
    text = format_report(report)
    assert "goodput 48.8 % (ETTR)" in text
    assert "failure of attempt 1: lost 15.00s (redone 4.50s" in text


# -- where it is shown ---------------------------------------------------------------------

GOODPUT = Goodput(
    60.0, 45.0, 5.0, (Loss(0, 2.0, 1.0, 0.5, 6.5), Loss(1, 1.0, 0.0, 0.25, None)), True
)


def test_the_record_and_the_json_carry_it() -> None:
    view = job_view(goodput=GOODPUT, restarts=1)
    entry = dict(fields(view, "m"))
    assert json.loads(entry["GPULAUNCH_GOODPUT"])["ettr"] == 0.75
    back = parse({**entry, "__REALTIME_TIMESTAMP": "1"})
    assert back.goodput == GOODPUT
    out = back.to_json()["goodput"]
    assert out["lost_seconds"] == 11.25 and out["failures"][1]["restart"] is None
    assert job_view().to_json()["goodput"] is None  # no steps: null, never a number
    assert "GPULAUNCH_GOODPUT" not in dict(fields(job_view(), "m"))


def test_the_bus_carries_it() -> None:
    assert goodput_from_wire(goodput_wire(GOODPUT)) == GOODPUT
    assert goodput_from_wire(goodput_wire(None)) is None
    props = job_view(goodput=GOODPUT).properties()
    assert JobView.from_properties({k: v for k, (_, v) in props.items()}).goodput == GOODPUT


def test_the_metrics_have_it_and_no_series_without_steps() -> None:
    spec, _ = make_job([["true"]])
    job = JobProgress(spec, Phase.RUNNING, (), 1, 1)
    text = prometheus_text(families(job, {}, "n", 0.0, GOODPUT))
    assert 'gpulaunch_job_goodput_ratio{job="t",node="n"} 0.75' in text
    assert 'gpulaunch_job_lost_seconds_total{job="t",node="n"} 11.25' in text
    assert 'gpulaunch_job_failures_total{job="t",node="n"} 2' in text
    assert "goodput" not in prometheus_text(families(job, {}, "n", 0.0, None))


def test_the_report_of_a_restarted_job_says_no_steps_reported() -> None:
    report = replace(job_view(restarts=1).report(), goodput=None)
    assert "goodput: no steps reported" in format_report(report)
