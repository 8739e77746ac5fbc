"""Reading a job's metrics in the box: its start's `metrics at ...` line, a scrape of the
endpoint from inside the box (its loopback), the body parsed by prometheus_client's
parsers (tests/integration/test_metrics.py, test_goodput.py)."""

from __future__ import annotations

import os
import select
import subprocess
import sys
import time
from typing import Any

from prometheus_client.openmetrics.parser import text_string_to_metric_families as om_parse
from prometheus_client.parser import text_string_to_metric_families as text_parse

from tests.integration.jobs import Job

SCRAPE = """
import sys, urllib.request
req = urllib.request.Request(sys.argv[1], headers={"Accept": sys.argv[2]})
with urllib.request.urlopen(req, timeout=30) as r:
    sys.stdout.write(r.headers["Content-Type"] + "\\n" + r.read().decode())
"""
OPENMETRICS = "application/openmetrics-text; version=1.0.0"

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(job: Job, url: str, accept: str = OPENMETRICS) -> tuple[str, str]:
    res = job.box.run(
        [sys.executable, "-c", SCRAPE, url, accept], capture_output=True, text=True, timeout=60
    )
    assert res.returncode == 0, res.stderr
    kind, _, body = res.stdout.partition("\n")
    return kind, body


def samples(text: str, open_metrics: bool = True) -> Samples:
    parse = om_parse if open_metrics else text_parse
    return {(s.name, frozenset(s.labels.items())): s.value for f in parse(text) for s in f.samples}


def value(got: Samples, name: str, **labels: str) -> float | None:
    """The one sample of `name` whose labels include `labels`."""
    found = [v for (n, ls), v in got.items() if n == name and set(labels.items()) <= ls]
    assert len(found) <= 1, (name, labels, found)
    return found[0] if found else None


def metrics_line(proc: subprocess.Popen[Any], timeout: float = 120) -> str:
    """The start's `metrics at ...` line, read from its stderr's fd as it comes (raw: a
    text wrapper's buffer would hide lines from select)."""
    assert proc.stderr is not None
    fd = proc.stderr.fileno()
    deadline = time.monotonic() + timeout
    seen = b""
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        chunk = os.read(fd, 65536) if ready else b""
        if not chunk:
            break
        seen += chunk
        for line in seen.decode(errors="replace").split("\n")[:-1]:  # whole lines only
            if ": metrics at " in line:
                return line.strip()
    raise AssertionError(f"no metrics line: {seen!r}")
