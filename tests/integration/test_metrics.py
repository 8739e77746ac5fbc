"""Metrics for Prometheus (issue 26 item 4) from a running job in a real systemd: the
endpoint and the textfile, read back with prometheus_client's parsers, against what
`gpulaunch status --resources` says of the same ranks; bad options leave nothing behind.

The endpoint is scraped from inside the box (its loopback), the body parsed here.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from typing import Any

import pytest

from tests.integration.jobs import GPULAUNCH, REPO, Job, assert_clean, new_job, wait_until
from tests.integration.scrape import (
    OPENMETRICS,
    SCRAPE,
    Samples,
    metrics_line,
    samples,
    scrape,
    value,
)
from tests.integration.shared import assert_user_clean, finish, make_user

pytestmark = pytest.mark.integration

SCRIPT = str(REPO / "tests" / "integration" / "scripts" / "usage_rank.py")
MiB = 1 << 20


def gl(job: Job, *argv: str) -> subprocess.CompletedProcess[str]:
    return job.box.run(
        [GPULAUNCH, *argv], cwd=str(REPO), capture_output=True, text=True, timeout=120
    )


def test_the_metrics_of_a_running_job_parse_and_match_status_resources(job: Job) -> None:
    textdir = job.dir / "textfile"
    textdir.mkdir()
    proc = job.popen(
        "--nproc",
        "2",
        "--metrics-listen",
        "127.0.0.1:0",
        "--metrics-textfile",
        str(textdir),
        "--metrics-interval",
        "1",
        script=SCRIPT,
        script_args=["--hold-rank", "1", "--hold-mb", "100"],
    )
    try:
        line = metrics_line(proc)
        found = re.search(r"metrics at (http://\S+/metrics) and (\S+\.prom)$", line)
        assert found is not None, line
        url, textfile = found.groups()
        for rank in (0, 1):
            job.wait_file(f"rank{rank}.ready")
        kind, before_text = scrape(job, url)
        assert kind.startswith("application/openmetrics-text; version=1.0.0"), kind
        status = gl(job, "status", job.id, "--resources", "--json")
        _, after_text = scrape(job, url)
        assert status.returncode == 0, status.stderr
        before, after = samples(before_text), samples(after_text)
        resources: dict[str, Any] = json.loads(status.stdout)["resources"]
        pids = job.pids()
        for r in resources["ranks"]:
            rank = str(r["rank"])
            labels = {"job": job.id, "rank": rank}
            state = value(after, "gpulaunch_rank_state", gpulaunch_rank_state="running", **labels)
            assert state == 1, after_text
            # CPU time: the unit's cgroup, read by status between the two scrapes
            cpu = "gpulaunch_rank_cpu_seconds_total"
            low, high = value(before, cpu, **labels), value(after, cpu, **labels)
            assert low is not None and high is not None, after_text
            assert low - 0.01 <= r["cpu_sec"] <= high + 0.01, (low, r, high)
            # memory: resident memory of the unit's processes (and memory.current where
            # this machine has the controller: the box has not)
            rss = value(after, "gpulaunch_rank_resident_memory_bytes", **labels)
            assert rss is not None and abs(rss - r["rss"]) <= 8 * MiB, (rss, r)
            current = value(after, "gpulaunch_rank_memory_bytes", **labels)
            assert (current is None) == (r["cgroup_memory"] is None), (current, r)
            if current is not None:
                assert abs(current - r["cgroup_memory"]) <= 8 * MiB, (current, r)
            assert value(after, "gpulaunch_rank_processes", **labels) == r["processes"]
            assert ("gpulaunch_rank_step", frozenset()) not in after  # usage_rank.py: no steps
        held = value(after, "gpulaunch_rank_resident_memory_bytes", rank="1")
        idle = value(after, "gpulaunch_rank_resident_memory_bytes", rank="0")
        assert held is not None and idle is not None and held - idle >= 90 * MiB
        assert value(after, "gpulaunch_job_ranks", job=job.id) == 2
        assert value(after, "gpulaunch_job_restarts_total", job=job.id) == 0
        assert value(after, "gpulaunch_job_phase", gpulaunch_job_phase="running") == 1
        assert sorted(pids) == ["rank0", "rank1"]
        # the text format (curl, older scrapers) carries the same series
        kind, text = scrape(job, url, accept="text/plain")
        assert kind.startswith("text/plain; version=0.0.4"), kind
        assert {n for n, _ in samples(text, open_metrics=False)} == {n for n, _ in after}
        # the textfile: node_exporter's format, rewritten every second
        written = samples(open(textfile).read(), open_metrics=False)
        assert value(written, "gpulaunch_rank_state", rank="1", gpulaunch_rank_state="running")
        assert {n for n, _ in written} == {n for n, _ in after}
    finally:
        gl(job, "stop", job.id)
        proc.communicate(timeout=120)
    assert proc.returncode == 143, proc.returncode
    # the job is gone: so are its file and its port
    assert list(textdir.iterdir()) == []
    res = job.box.run([sys.executable, "-c", SCRAPE, url, OPENMETRICS], capture_output=True)
    assert res.returncode != 0
    assert_clean(job)


def test_steps_from_the_progress_channel_are_in_the_metrics_as_in_status(job: Job) -> None:
    """The two halves of issue 26 together: ranks that report steps through
    gpulaunch.progress (one of them slower) show the same step, total and straggler
    flag in the scrape as in `status --json`."""
    stepper = str(REPO / "tests" / "integration" / "scripts" / "stepper.py")
    proc = job.popen(
        "--nproc",
        "2",
        "--metrics-listen",
        "127.0.0.1:0",
        script=stepper,
        script_args=["--steps", "6", "--step-seconds", "0.05"],
    )
    try:
        url = metrics_line(proc).split("metrics at ")[1]
        for rank in (0, 1):
            job.wait_file(f"rank{rank}.done", timeout=120)

        def both_at_six() -> Samples | None:
            got = samples(scrape(job, url)[1])
            steps = [value(got, "gpulaunch_rank_step", rank=str(r)) for r in (0, 1)]
            return got if steps == [6, 6] else None

        wait_until(lambda: both_at_six() is not None, 30, "step 6 of both ranks in the scrape")
        got = both_at_six()
        assert got is not None
        status = gl(job, "status", job.id, "--json")
        assert status.returncode == 0, status.stderr
        for r in json.loads(status.stdout)["ranks"]:
            labels = {"job": job.id, "rank": str(r["rank"])}
            steps = r["steps"]
            assert value(got, "gpulaunch_rank_step", **labels) == steps["step"] == 6
            assert value(got, "gpulaunch_rank_steps_expected", **labels) == steps["total"] == 6
            assert value(got, "gpulaunch_rank_straggler", **labels) == float(steps["straggler"])
            rate = value(got, "gpulaunch_rank_steps_per_second", **labels)
            assert rate is not None and rate > 0
            since = value(got, "gpulaunch_rank_last_step_age_seconds", **labels)
            assert since is not None and since >= 0
    finally:
        gl(job, "stop", job.id)
        proc.communicate(timeout=120)
    assert proc.returncode == 143, proc.returncode
    assert_clean(job)


def test_a_metrics_port_in_use_is_one_line_and_leaves_nothing(job: Job) -> None:
    proc = job.popen("--nproc", "1", "--metrics-listen", "127.0.0.1:0", script=SCRIPT)
    try:
        url = metrics_line(proc).split("metrics at ")[1]
        port = url.split(":")[2].split("/")[0]
        other = new_job(job.box, "metrics-port-taken")
        try:
            res = other.run("--nproc", "1", "--metrics-listen", f"127.0.0.1:{port}", script=SCRIPT)
            assert res.returncode == 69, res.stderr
            lines = [line for line in res.stderr.splitlines() if "error" in line]
            assert len(lines) == 1, res.stderr
            assert lines[0].startswith(
                f"gpulaunch: error: cannot serve metrics on 127.0.0.1:{port}: "
                "Address already in use; name an address of this machine and a free port"
            ), res.stderr
            assert "Traceback" not in res.stderr
            assert_clean(other)
        finally:
            other.stop()
    finally:
        gl(job, "stop", job.id)
        proc.communicate(timeout=120)


def test_a_missing_textfile_directory_is_one_line(job: Job) -> None:
    res = job.run("--nproc", "1", "--metrics-textfile", str(job.dir / "missing"), script=SCRIPT)
    assert res.returncode == 2, res.stderr
    assert "--metrics-textfile" in res.stderr and "No such file or directory" in res.stderr
    assert "Traceback" not in res.stderr
    wait_until(lambda: not job.units(), 10, "no units")
    assert_clean(job)


def test_an_ordinary_user_s_job_serves_and_writes_its_metrics(box: Any, job: Job) -> None:
    """From a login shell: the watcher runs as the front end's service of the user's
    manager (it binds the port, writes the file as the user), the front end shows the line."""
    login = make_user(box, "glmetrics", manager=True)
    os.chmod(job.dir, 0o777)
    textdir = job.dir / "textfile"
    textdir.mkdir()
    os.chmod(textdir, 0o777)
    opts = ["--nproc", "2", "--metrics-listen", "127.0.0.1:0", "--metrics-textfile", str(textdir)]
    proc = login.popen(job.argv(*opts, script=SCRIPT))
    try:
        found = re.search(r"metrics at (http://\S+/metrics) and (\S+\.prom)$", metrics_line(proc))
        assert found is not None
        url, textfile = found.groups()
        for rank in (0, 1):
            job.wait_file(f"rank{rank}.ready")
        _, body = scrape(job, url)
        got = samples(body)
        for rank in ("0", "1"):
            labels = {"job": job.id, "rank": rank}
            assert value(got, "gpulaunch_rank_state", gpulaunch_rank_state="running", **labels)
            cpu = value(got, "gpulaunch_rank_cpu_seconds_total", **labels)
            assert cpu is not None and cpu > 0, body  # each rank a scope of the user manager
        assert os.stat(textfile).st_uid == login.uid
        login.box.run(["kill", "-TERM", str(login.frontend_pid(job))], check=True)
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 143, err
    finally:
        if proc.poll() is None:
            finish(job, proc)
    assert list(textdir.iterdir()) == []
    assert_user_clean(login, job)


IDLE_THEN_SCRAPE = """
import json, socket, sys, urllib.request
port = int(sys.argv[1])
idle = [socket.create_connection(("127.0.0.1", port), timeout=30) for _ in range(40)]
ok = 0
for _ in range(25):
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as r:
            ok += r.status == 200 and b"gpulaunch_job_ranks" in r.read()
    except OSError as exc:
        print(exc, file=sys.stderr)
print(json.dumps({"ok": ok}))
"""


def test_port_alone_listens_on_loopback_and_idle_connections_deny_no_scrape(job: Job) -> None:
    """Issue 35: `--metrics-listen PORT` bound every address, and 40 idle connections (16
    clients at most, each allowed to idle 30 s) made 24 of 25 scrapes fail. PORT alone is
    loopback now, and every scrape is answered while another user holds 40 idle
    connections."""
    proc = job.popen("--nproc", "1", "--metrics-listen", "0", script=SCRIPT)
    try:
        url = metrics_line(proc).split("metrics at ")[1]
        found = re.fullmatch(r"http://127\.0\.0\.1:(\d+)/metrics", url)
        assert found, url  # loopback, IPv4: no other address
        job.wait_file("rank0.ready")
        res = job.box.run(
            ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
            + [sys.executable, "-I", "-c", IDLE_THEN_SCRAPE, found[1]],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert res.returncode == 0, res.stderr
        assert json.loads(res.stdout) == {"ok": 25}, res.stderr
    finally:
        gl(job, "stop", job.id)
        proc.communicate(timeout=120)
    assert proc.returncode == 143, proc.returncode
    assert_clean(job)
