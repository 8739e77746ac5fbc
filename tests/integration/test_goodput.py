"""Goodput with scripted failures under the box's systemd (issue 39 item 2).

Two ranks step every 0.1 s, checkpoint every 10 steps; rank 1 exits 3 after step 32 of the
first attempt; --max-restarts 1 restarts both from their checkpoints (step 30); after step
60 they wait 8 s and exit 0. Each rank
writes its own truth (the CLOCK_MONOTONIC time of each step, checkpoint and its failure:
scripts/goodput_rank.py). The job's ETTR and the time its failure cost, in the metrics
and `status --json` (the bus) while it runs, then in `status --json`, the record and the
report, are within 2 % of what
the truth says by the definitions of docs/progress.md ("Goodput"); `status` and `list --all`
show it.
"""

from __future__ import annotations

import json
import re
import time
from typing import Any

import pytest

from tests.integration.jobs import REPO, Job, assert_clean, wait_until
from tests.integration.scrape import metrics_line, samples, scrape, value
from tests.integration.shared import finish, gl

pytestmark = pytest.mark.integration

SCRIPT = str(REPO / "tests" / "integration" / "scripts" / "goodput_rank.py")
RANKS = (0, 1)
STEPS, EVERY, FAIL_STEP = 60, 10, 32
CLOSE = 0.02  # ±2 %


def events(job: Job) -> list[dict[str, Any]]:
    out = []
    for rank in RANKS:
        path = job.dir / f"truth{rank}"
        if path.exists():
            out += [json.loads(line) for line in path.read_text().splitlines() if line]
    return out


def times(found: list[dict[str, Any]], attempt: int, event: str) -> list[float]:
    return [e["t"] for e in found if e["attempt"] == attempt and e["event"] == event]


def stepped_for(found: list[dict[str, Any]], attempt: int) -> float:
    """Seconds from the attempt's first step to its last so far (0: none)."""
    steps = times(found, attempt, "step")
    return max(steps) - min(steps) if steps else 0.0


def truth(found: list[dict[str, Any]]) -> tuple[float, float, float]:
    """(productive seconds, seconds the failure cost, the span from the first step to the
    last) by docs/progress.md's definitions, from the ranks' own records."""
    first = [min(times(found, a, "step")) for a in (0, 1)]
    last = [max(times(found, a, "step")) for a in (0, 1)]
    saved = max(t for t in times(found, 0, "checkpoint") if t <= last[0])
    productive = (saved - first[0]) + (last[1] - first[1])  # attempt 0 lost what followed
    return productive, first[1] - saved, last[1] - first[0]


def near(got: float, want: float) -> bool:
    return abs(got - want) <= CLOSE * want


def test_ettr_and_lost_work_match_the_script_s_own_truth(job: Job) -> None:
    began = time.monotonic()
    proc = job.popen(
        "--nproc",
        "2",
        "--max-restarts",
        "1",
        "--metrics-listen",
        "127.0.0.1:0",
        script=SCRIPT,
        script_args=[
            *("--steps", str(STEPS), "--every", str(EVERY), "--fail-step", str(FAIL_STEP)),
            *("--linger", "8"),  # after its last step: time to read the metrics
        ],
    )
    try:
        found = re.search(r"metrics at (http://\S+/metrics)", metrics_line(proc))
        assert found is not None
        # attempt 1 stepped for over a second: the observers heard of its first step
        # (channel.py: at most NOTIFY_EVERY, 1 s, after it), so the failure's cost is known
        wait_until(lambda: stepped_for(events(job), 1) >= 1.5, 120, "attempt 1's steps")
        live = samples(scrape(job, found.group(1))[1])
        running = gl(job, "status", job.id, "--json", timeout=60)  # from the bus
        shown = gl(job, "status", job.id, timeout=60).stdout
        _, err = proc.communicate(timeout=120)
    finally:
        code, err2 = finish(job, proc)  # (a failed wait: stopped)
    took = time.monotonic() - began
    assert code == 0, err + err2
    found_events = events(job)
    assert [e["step"] for e in found_events if e["event"] == "fail"] == [FAIL_STEP]
    productive, lost, span = truth(found_events)

    # the metrics, while attempt 1 ran
    assert value(live, "gpulaunch_job_failures_total") == 1, live
    live_lost = value(live, "gpulaunch_job_lost_seconds_total")
    assert live_lost is not None and near(live_lost, lost), (live_lost, lost)
    ratio = value(live, "gpulaunch_job_goodput_ratio")
    assert ratio is not None and 0 < ratio < 1, live
    # status of the running job, from its watcher on the bus
    assert running.returncode == 0, running.stderr
    so_far = json.loads(running.stdout)["goodput"]
    assert near(so_far["lost_seconds"], lost) and so_far["failures"][0]["restart"] > 0, so_far
    assert "goodput " in shown and "1 failure lost" in shown, shown

    # status --json (the record, read back), the record itself, the report
    res = gl(job, "status", job.id, "--json", timeout=60)
    assert res.returncode == 0, res.stderr
    g = json.loads(res.stdout)["goodput"]
    record = json.loads(job.record()["GPULAUNCH_GOODPUT"])
    for got in (g, record):
        assert near(got["productive_seconds"], productive), (got, productive)
        assert near(got["lost_seconds"], lost), (got, lost)
        assert near(got["ettr"], productive / got["wall_seconds"]), (got, productive)
        assert span < got["wall_seconds"] < took, (got, span, took)
        assert [f["attempt"] for f in got["failures"]] == [0], got
        failure = got["failures"][0]
        parts = failure["redone"] + failure["detection"] + failure["stop"] + failure["restart"]
        assert parts == pytest.approx(failure["total"]) and failure["restart"] > 0, failure
        # redone: from the checkpoint at step 30 to attempt 0's last step (within 2 % of
        # the failure's cost: each end is a datagram's arrival, a few ms after the truth)
        redone = max(times(found_events, 0, "step")) - max(times(found_events, 0, "checkpoint"))
        assert abs(failure["redone"] - redone) <= CLOSE * lost, (failure, redone)
        assert got["checkpoints"] is True
    assert "goodput " in err and "failure of attempt 1: lost " in err, err  # the report
    text = gl(job, "status", job.id, timeout=60).stdout
    assert "goodput " in text and "(ETTR)" in text, text
    listed = gl(job, "list", "--all", timeout=60).stdout
    row = next(line.split() for line in listed.splitlines() if line.startswith(job.id + " "))
    assert row[4] == f"{100 * g['ettr']:.1f}%", listed  # its GOODPUT column
    assert_clean(job)


def test_a_job_whose_ranks_report_no_steps_says_so(job: Job) -> None:
    res = job.run("--nproc", "1", script_args=["--sleep", "0.1"])
    assert res.returncode == 0, res.stderr
    status = gl(job, "status", job.id, timeout=60)
    assert "goodput: no steps reported" in status.stdout, status.stdout
    out = gl(job, "status", job.id, "--json", timeout=60)
    assert json.loads(out.stdout)["goodput"] is None, out.stdout
    assert "GPULAUNCH_GOODPUT" not in job.record()
    listed = gl(job, "list", "--all", timeout=60).stdout
    row = next(line.split() for line in listed.splitlines() if line.startswith(job.id + " "))
    assert row[4] == "-", listed  # no goodput, never a number
