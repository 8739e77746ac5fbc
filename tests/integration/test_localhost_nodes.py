"""Two nodes of one job on one machine and its systemd, as `--nnodes 2` is tried on localhost
(issue 35 item 6): with no `--job` each launcher gets an id of its own, so neither finds the
other's units "already running"; the rendezvous (one run id) still makes them one job."""

from __future__ import annotations

import re
import socket
import subprocess
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from gpulaunch.base.names import UnitNames
from tests.integration.jobs import GPULAUNCH, RANK_SCRIPT, REPO, SHARED

pytestmark = pytest.mark.integration


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def two_launchers(box: Any, options: Callable[[int, str], list[str]]) -> list[str]:
    """Start both nodes at once with no --job (`options(node, port)`); both must exit 0, each
    rank in its own job's units. Their job ids, node 0's first."""
    work = SHARED / f"localhost-nodes-{uuid.uuid4().hex[:6]}"
    port = str(free_port())
    for node in (0, 1):
        (work / str(node)).mkdir(parents=True)

    def argv(node: int) -> list[str]:
        return [
            GPULAUNCH, "start", "--nnodes", "2", *options(node, port), "--nproc", "1",
            "--grace", "5", RANK_SCRIPT, "--dir", str(work / str(node)), "--print",
        ]  # fmt: skip

    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True}
    procs = [box.popen(argv(node), cwd=str(REPO), **pipes) for node in (0, 1)]
    ended = [p.communicate(timeout=180) for p in procs]
    jobs = []
    try:
        for p, (out, err) in zip(procs, ended, strict=True):
            found = re.search(r"^gpulaunch: job (\S+): ", err, re.M)
            if found is not None:
                jobs.append(found.group(1))
            assert p.returncode == 0, err
            assert "already running" not in err and found is not None, err
            names = UnitNames.for_job(found.group(1))  # the rank ran in its own job's units
            assert f"/{names.job_slice}/{names.ranks_slice}/" in out, out
    finally:
        for j in jobs:
            box.run(["systemctl", "stop", UnitNames.for_job(j).job_slice], capture_output=True)
    assert len(set(jobs)) == 2, jobs
    assert jobs[0].rsplit("-", 1)[0] == jobs[1].rsplit("-", 1)[0]  # one run id
    return jobs


def test_two_launchers_of_one_job_on_one_machine_with_default_ids(box: Any) -> None:
    jobs = two_launchers(
        box, lambda node, port: ["--node-rank", str(node), "--master-addr", "127.0.0.1",
                                 "--master-port", port],
    )  # fmt: skip
    assert [j.rsplit("-", 1)[1] for j in jobs] == ["node0", "node1"], jobs


def test_two_c10d_launchers_on_one_machine_with_default_ids(box: Any) -> None:
    """c10d numbers the nodes in the rendezvous: each launcher's id has a suffix of its own."""
    two_launchers(
        box, lambda node, port: ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}"]
    )
