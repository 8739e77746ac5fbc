"""Where the time of a restart goes (issue 36 item 4), under the box's systemd and the
direct supervisor: two ranks print a line and step; rank 1 exits 3 at step 3 of the first
attempt; --max-restarts 1 restarts both. The restart's phases (failure seen, ranks
stopped, ranks forked, every rank's first line, every rank's first step) are in order in
the metrics and `status --json` while the second attempt runs, then in `status --json`,
the record and the report; the first attempt's count from the start line."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from tests.integration.jobs import REPO, Job, assert_clean, wait_until
from tests.integration.scrape import Samples, metrics_line, samples, scrape
from tests.integration.shared import finish, gl

pytestmark = pytest.mark.integration

SCRIPT = str(REPO / "tests" / "integration" / "scripts" / "phases_rank.py")
RESTART = ["failure_seen", "ranks_stopped", "ranks_forked", "first_line", "first_step"]
FIRST = ["ranks_forked", "first_line", "first_step"]


def stepped(job: Job, attempt: int) -> bool:
    """Both ranks made their first step of `attempt` (their own records)."""
    found = 0
    for rank in (0, 1):
        path = job.dir / f"truth{rank}"
        lines = path.read_text().splitlines() if path.exists() else []
        found += any(
            e["attempt"] == attempt and e["event"] == "step" for e in map(json.loads, lines)
        )
    return found == 2


def in_order(phases: dict[str, float], names: list[str]) -> None:
    assert list(phases) == names, phases  # each phase seen, in the order they happen
    times = list(phases.values())
    assert times == sorted(times) and times[0] >= 0, phases


def check(phases: list[dict[str, Any]]) -> None:
    assert [(p["attempt"], p["since"]) for p in phases] == [(0, "start"), (1, "failure")]
    in_order(phases[0]["phases"], FIRST)
    in_order(phases[1]["phases"], RESTART)
    assert phases[1]["phases"]["failure_seen"] == 0


def counts(live: Samples) -> dict[str, float]:
    """The restart phase histogram's counts, by phase."""
    return {
        dict(labels)["phase"]: v
        for (name, labels), v in live.items()
        if name == "gpulaunch_restart_phase_seconds_count"
    }


@pytest.mark.parametrize("supervisor", ["systemd", "direct"])
def test_a_restart_s_phases_are_recorded_in_order(job: Job, supervisor: str) -> None:
    def restart_counts(url: str) -> dict[str, float]:
        return counts(samples(scrape(job, url)[1]))

    chosen = ("--supervisor", "direct") if supervisor == "direct" else ()
    proc = job.popen(
        *chosen,
        *("--nproc", "2", "--max-restarts", "1", "--metrics-listen", "127.0.0.1:0"),
        script=SCRIPT,
        script_args=["--steps", "20", "--linger", "4"],
    )
    try:
        found = re.search(r"metrics at (http://\S+/metrics)", metrics_line(proc))
        assert found is not None
        # every rank stepped in attempt 1, and the watcher heard it (at most 1 s later)
        wait_until(lambda: stepped(job, 1), 120, "attempt 1's first steps")
        url = found.group(1)
        wait_until(lambda: "first_step" in restart_counts(url), 30, "its first step")
        live = samples(scrape(job, url)[1])
        running = gl(job, "status", job.id, "--json", timeout=60)  # while attempt 1 runs
        _, err = proc.communicate(timeout=120)
    finally:
        code, err2 = finish(job, proc)
    assert code == 0, err + err2

    # the metrics, while attempt 1 ran: one restart, a histogram per phase
    assert counts(live) == dict.fromkeys(RESTART, 1), live
    sums = {
        dict(labels)["phase"]: v
        for (name, labels), v in live.items()
        if name == "gpulaunch_restart_phase_seconds_sum"
    }
    in_order({n: sums[n] for n in RESTART}, RESTART)

    # status --json while attempt 1 ran (the bus; a record file is written at each phase
    # change: the phases up to its ranks forked)
    assert running.returncode == 0, running.stderr
    so_far = json.loads(running.stdout)["phases"]
    assert [p["attempt"] for p in so_far] == [0, 1], so_far
    assert list(so_far[1]["phases"])[:3] == RESTART[:3], so_far

    # status --json (the record, read back), the record itself, the report
    res = gl(job, "status", job.id, "--json", timeout=60)
    assert res.returncode == 0, res.stderr
    check(json.loads(res.stdout)["phases"])
    if supervisor == "systemd":
        check(json.loads(job.record()["GPULAUNCH_PHASES"]))
    assert "where each restart's time went" in err, err
    header = "RESTART  RANKS STOPPED  RANKS FORKED  FIRST LINE  FIRST STEP"
    assert header in err, err
    assert_clean(job)
