"""Two nodes of one job on one machine and its systemd, as `--nnodes 2` is tried on localhost
(issue 35 item 6): with no `--job` each launcher gets an id of its own, so neither finds the
other's units "already running"; the rendezvous (one run id) still makes them one job."""

from __future__ import annotations

import re
import socket
import subprocess
import uuid
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


def test_two_launchers_of_one_job_on_one_machine_with_default_ids(box: Any) -> None:
    work = SHARED / f"localhost-nodes-{uuid.uuid4().hex[:6]}"
    work.mkdir(parents=True)
    port = str(free_port())
    for node in (0, 1):
        (work / str(node)).mkdir()

    def argv(node: int) -> list[str]:
        return [
            GPULAUNCH, "start", "--nnodes", "2", "--node-rank", str(node),
            "--master-addr", "127.0.0.1", "--master-port", port, "--nproc", "1",
            "--grace", "5", RANK_SCRIPT, "--dir", str(work / str(node)), "--print",
        ]  # fmt: skip

    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True}
    procs = [box.popen(argv(node), cwd=str(REPO), **pipes) for node in (0, 1)]
    ended = [p.communicate(timeout=180) for p in procs]
    jobs = []
    try:
        for node, (p, (out, err)) in enumerate(zip(procs, ended, strict=True)):
            assert p.returncode == 0, err
            assert "already running" not in err, err
            found = re.search(r"^gpulaunch: job (\S+): ", err, re.M)
            assert found is not None, err
            jobs.append(found.group(1))
            assert f"node {node} of 2" in err, err
            # the rank ran in its own job's units
            names = UnitNames.for_job(found.group(1))
            assert f"/{names.job_slice}/{names.ranks_slice}/" in out, out
        assert jobs[0] != jobs[1], jobs
        assert [j.rsplit("-", 1)[1] for j in jobs] == ["node0", "node1"], jobs
        assert jobs[0].rsplit("-", 1)[0] == jobs[1].rsplit("-", 1)[0]  # one run id
    finally:
        for j in jobs:
            box.run(["systemctl", "stop", UnitNames.for_job(j).job_slice], capture_output=True)
