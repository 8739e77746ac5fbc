"""Restarts across nodes (--max-restarts) and elastic membership (--nnodes MIN:MAX).

Three nodes on loopback, each a systemd box of its own, as in test_multinode.py (whose
fixtures and helpers these tests share, from shared.py): every node restarts through
torch's rendezvous.
"""

from __future__ import annotations

import base64
import json
import os
import pickle
import re
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from subprocess import PIPE, Popen

import pytest

from gpulaunch.base.protocol import NODE_LOST_STATUS
from sdbox import Box, HostSystemd
from tests.integration.conftest import box_files
from tests.integration.jobs import GPULAUNCH, REPO, SHARED, wait_until
from tests.integration.shared import (
    NNODES,
    NPROC,
    Ended,
    MultiJob,
    free_port,
    host,
    mjob,
    node_ranks,
    nodes,
)
from tests.integration.shared import finish_nodes as finish

pytestmark = pytest.mark.integration

__all__ = ["mjob", "nodes"]  # fixtures


ELASTIC = ["c10d", "gpulaunch"]  # torch's dynamic rendezvous, and gpulaunch's own on its store


def c10d(job: MultiJob, nnodes: str, backend: str = "c10d") -> list[str]:
    return [
        *("--nnodes", nnodes, "--rdzv-backend", backend),
        *("--rdzv-endpoint", f"127.0.0.1:{job.port}"),
    ]


def last_call(backend: str) -> list[str]:
    """How long the first round of --nnodes 2:3 waits for the third node once two are there.

    torch's c10d checks its deadline once a second, so 1 s is 1-2 s; gpulaunch's decider at
    each beat (0.1 s): 3 s, so that a third box's peer still importing torch is in it.
    """
    return ["--rdzv-conf", "last_call_timeout=1" if backend == "c10d" else "last_call_timeout=3"]


def start_c10d(job: MultiJob, nodes: int, opts: list[str], args: list[str]) -> list[Popen[str]]:
    """Node 0 first, the others once it serves the endpoint: the boxes share loopback, where
    torch lets whichever node binds the port first serve the rendezvous (on real machines
    only the endpoint's own node can), and these tests kill node 2."""
    procs = job.start([opts], args)
    wait_until(lambda: served(job.port) or procs[0].poll() is not None, 60, "node 0's store")
    for n in range(1, nodes):
        box = job.boxes[n]
        argv = job.argv(n, opts, args)
        procs.append(box.popen(argv, cwd=str(REPO), stdout=PIPE, stderr=PIPE, text=True))
    return procs


def spares(job: MultiJob, backend: str = "c10d") -> int:
    """How many nodes torch's c10d rendezvous holds as spares (its state's redundancy list,
    as torch's C10dRendezvousBackend keeps it in the job's store: base64 of a pickle);
    gpulaunch's: how many wait in its open round (gpulaunch/multinode/membership.py)."""
    from torch.distributed import TCPStore

    store = TCPStore("127.0.0.1", job.port, is_master=False, wait_for_workers=False)
    if backend == "gpulaunch":
        from torch.distributed import PrefixStore

        keys = PrefixStore(f"gpulaunch-rdzv/{job.id}/", store)
        return int(keys.add(f"r{keys.add('open', 0)}/n", 0))
    raw = store.get(f"torch.rendezvous.{job.id}")
    if raw == b"Y2FuaW1hZGFt":  # torch's sentinel for "no state yet"
        return 0
    return len(pickle.loads(base64.b64decode(raw)).redundancy_list)


def served(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.parametrize("backend", ["static", *ELASTIC])
def test_a_rank_failure_on_node_2_restarts_every_node(mjob: MultiJob, backend: str) -> None:
    opts = [
        [
            *(mjob.static(n) if backend == "static" else c10d(mjob, str(NNODES), backend)),
            "--max-restarts",
            "1",
        ]
        for n in range(NNODES)
    ]
    # rank 4 is node 2's first (c10d numbers the nodes by address: 127.0.0.3 is node 2)
    procs = mjob.start(opts, ["--fail-rank", "4", "--fail-attempt", "0"])
    ended = finish(procs, mjob.boxes, timeout=240)
    cause = f"attempt 0: node 2 ({host(2)}): rank 4 exit 1 (status 1); every node went on"
    for e in ended:
        assert e.returncode == 0, e.stderr
        for rank in node_ranks(e.node):
            local = rank - e.node * NPROC
            done = f"rank {rank} of 6 done: local {local} node {e.node} of 3 attempt 1"
            assert done in e.stdout, e.stdout
        assert cause in e.stderr, e.stderr
        assert "restarting the ranks of every node (restart 1 of 1)" in e.stderr
        # where the restart's time went: the round between the stop and the fork (phases.py)
        assert "RESTART  RANKS STOPPED  ROUND OPENED  ROUND CLOSED  RANKS FORKED" in e.stderr
        assert mjob.leftovers(e.node) == []
    for rank in range(NNODES * NPROC):  # the second attempt's environment, on every node
        env = mjob.env(rank)
        assert env["TORCHELASTIC_RESTART_COUNT"] == "1"
        assert env["WORLD_SIZE"] == "6" and env["GPULAUNCH_JOB"] == mjob.job_id(rank // NPROC)
        assert env["GPULAUNCH_UNIT"] == f"gpulaunch-{mjob.job_id(rank // NPROC)}-rank{rank}.scope"
    # The record of every node lists both attempts: the first with its cause.
    for node, box in enumerate(mjob.boxes):
        text = box.run([GPULAUNCH, "status", mjob.job_id(node)], capture_output=True).stdout
        assert "succeeded" in text and cause in text, text
        assert "restarted 1 time" in text


@pytest.mark.parametrize("backend", ELASTIC)
@pytest.mark.parametrize("lost", [2, 1])
def test_a_lost_node_under_an_elastic_range_leaves_a_smaller_world(
    mjob: MultiJob, lost: int, backend: str
) -> None:
    """Node 2 (or 1) is lost; the others go on as 2 nodes. Losing node 1 renumbers node 2's
    ranks (4-5 become 2-3): their scopes are named for their new numbers."""
    opts = [*c10d(mjob, "2:3", backend), *last_call(backend)]
    # Attempt 0 computes (sleeps) until the node goes; attempt 1 runs its steps to the end.
    procs = start_c10d(mjob, NNODES, opts, ["--busy", "--busy-attempt", "0"])
    mjob.wait_stamps(range(NNODES * NPROC), "busy")
    assert {mjob.env(r)["GROUP_RANK"] for r in node_ranks(lost)} == {str(lost)}
    t0 = time.time()
    os.kill(mjob.boxes[lost].inner_pid(procs[lost]), signal.SIGKILL)
    ended = finish(procs, mjob.boxes, timeout=240)
    assert ended[lost].returncode == -signal.SIGKILL
    print(f"node {lost}'s watcher SIGKILLed -> the others ended, 2 nodes: {time.time() - t0:.2f} s")
    cause = f"attempt 0: node {lost} ({host(lost)}): its watcher died (status {NODE_LOST_STATUS})"
    for e in (e for e in ended if e.node != lost):
        assert e.returncode == 0, e.stderr
        assert f"the other nodes go on without node {lost} (--nnodes 2:3)" in e.stderr
        assert cause in e.stderr
        assert re.search(r"done: local 0 node [01] of 2 attempt 1", e.stdout), e.stdout
    for rank in range(2 * NPROC):
        env = mjob.env(rank)
        assert (env["WORLD_SIZE"], env["GROUP_WORLD_SIZE"]) == ("4", "2")
        assert env["TORCHELASTIC_RESTART_COUNT"] == "1"
        assert f"-rank{rank}.scope" in env["/proc/self/cgroup"], (rank, env["/proc/self/cgroup"])
    for node in range(NNODES):
        wait_until(lambda n=node: mjob.leftovers(n) == [], 10, f"node {node} cleaned up")
    if backend == "gpulaunch":  # the ranks were told who left, and why
        members = json.loads((mjob.dir / "rank0.members").read_text())
        assert (members["generation"], members["state"], members["world_size"]) == (
            1,
            "running",
            4,
        )
        assert [n["ranks"] for n in members["nodes"]] == [[0, 1], [2, 3]]
        assert members["left"] == [
            {"node": lost, "host": host(lost), "ranks": node_ranks(lost), "why": "its watcher died"}
        ]
        print(
            f"membership file written {members['written_at'] - members['decided_at']:.3f} s "
            "after the round was decided"
        )


def box_per_node(job: MultiJob) -> None:
    """These tests signal every process of node 2's job by the job's id (pkill -f): only
    where node 2 is a box of its own (its own pids) is that node 2's alone."""
    if job.shared_systemd:
        pytest.fail("this test needs a systemd box per node (the host runs systemd)")


def test_a_vanished_node_is_out_within_the_node_timeout(mjob: MultiJob) -> None:
    """gpulaunch's rendezvous: node 2's watcher, peer and ranks SIGKILLed at once (nobody
    says a word): its heartbeat's silence takes it out, the others go on as 2 nodes."""
    box_per_node(mjob)
    opts = [*c10d(mjob, "2:3", "gpulaunch"), *last_call("gpulaunch")]
    procs = start_c10d(mjob, NNODES, opts, ["--busy", "--busy-attempt", "0"])
    mjob.wait_stamps(range(NNODES * NPROC), "busy")
    mjob.boxes[2].run(["pkill", "-KILL", "-f", f"{mjob.id}"], capture_output=True)
    ended = finish(procs, mjob.boxes, timeout=240)
    for e in ended[:2]:
        assert e.returncode == 0, e.stderr
        assert "attempt 0: node 2 (127.0.0.3): lost: no heartbeat for" in e.stderr, e.stderr
        assert re.search(r"done: local 0 node [01] of 2 attempt 1", e.stdout), e.stdout


def test_a_node_stalled_for_a_second_is_not_lost(mjob: MultiJob) -> None:
    """Item 2 of issue 37: every process of node 2 stopped (SIGSTOP) for 1 s, then let go:
    under the default bound (2 s) no node is lost and no rank is stopped."""
    box_per_node(mjob)
    opts = [*c10d(mjob, "2:3", "gpulaunch"), *last_call("gpulaunch")]
    procs = start_c10d(mjob, NNODES, opts, ["--busy", "--busy-attempt", "0"])
    mjob.wait_stamps(range(NNODES * NPROC), "busy")
    box = mjob.boxes[2]
    box.run(["pkill", "-STOP", "-f", mjob.id], capture_output=True)
    time.sleep(1.0)  # the stall itself (what is injected), not a claim about speed
    box.run(["pkill", "-CONT", "-f", mjob.id], capture_output=True)
    # nsenter (outside the box) stops itself when its child stops: it goes on too
    os.kill(procs[2].pid, signal.SIGCONT)
    # A false loss would be told at once: the cause stops every node's ranks (a `term`
    # stamp each) and every node says so.
    time.sleep(4.0)  # twice the bound: a loss of the stall would be declared by now
    assert [p.poll() for p in procs] == [None, None, None]
    assert not any((mjob.dir / f"rank{r}.term").exists() for r in range(NNODES * NPROC))
    for box in mjob.boxes:  # the job has made its point: end it at once, everywhere
        box.run(["pkill", "-KILL", "-f", mjob.id], capture_output=True)
    mjob.stop_all()
    for node, p in enumerate(procs):
        _, err = p.communicate(timeout=120)
        assert "lost" not in err and "attempt 0:" not in err, (node, err)


@pytest.fixture
def spare_job(nodes: list[Box | HostSystemd]) -> Iterator[MultiJob]:
    """The three nodes and a fourth box, node 3 (127.0.0.4), booted for this test."""
    if isinstance(nodes[0], HostSystemd):
        pytest.fail("the spare test needs a systemd box per node (the host runs systemd)")
    with Box(binds=[REPO], files=box_files()) as fourth:
        job_id = f"spare{uuid.uuid4().hex[:6]}"
        d = SHARED / job_id
        d.mkdir(parents=True)
        j = MultiJob(boxes=[*nodes, fourth], id=job_id, dir=d, port=free_port())
        yield j
        j.stop_all()


@pytest.mark.parametrize("backend", ELASTIC)
def test_a_spare_beyond_max_takes_the_place_of_a_lost_node(
    spare_job: MultiJob, backend: str
) -> None:
    job = spare_job
    opts = [*c10d(job, "2:3", backend), *last_call(backend)]
    args = ["--busy", "--busy-attempt", "0"]
    procs = start_c10d(job, NNODES, opts, args)
    job.wait_stamps(range(NNODES * NPROC), "busy")
    spare = job.boxes[3].popen(
        job.argv(3, opts, args),
        cwd=str(REPO),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    # The spare waits in torch's rendezvous (beyond --nnodes' maximum): its peer is in it.
    peer = ["pgrep", "-f", f"gpulaunch.multinode.peer .*{job.id}"]
    wait_until(lambda: job.boxes[3].run(peer, capture_output=True).returncode == 0, 60, "spare")
    # torch's join: the spare is on the rendezvous' redundancy list (beyond the maximum).
    wait_until(lambda: spares(job, backend) == 1, 60, "the spare waits in the rendezvous")
    assert spare.poll() is None
    os.kill(job.boxes[2].inner_pid(procs[2]), signal.SIGKILL)
    ended = finish([procs[0], procs[1], spare], [job.boxes[0], job.boxes[1], job.boxes[3]], 240)
    procs[2].wait(timeout=30)
    ended[2] = Ended(3, ended[2].returncode, ended[2].stdout, ended[2].stderr)
    for e in ended:
        assert e.returncode == 0, e.stderr
    # The spare (127.0.0.4: after 127.0.0.2 in torch's order) is node 2 of the new world.
    for rank, node in ((4, ended[2]), (5, ended[2]), (0, ended[0]), (3, ended[1])):
        group = rank // NPROC
        done = f"rank {rank} of 6 done: local {rank % NPROC} node {group} of 3 attempt 1"
        assert done in node.stdout, node.stdout
    assert "attempt 0: node 2 (127.0.0.3): its watcher died" in ended[0].stderr
    assert job.env(4)["TORCHELASTIC_RESTART_COUNT"] == "1"


@pytest.mark.parametrize("backend", ELASTIC)
def test_a_node_that_starts_late_joins_at_the_next_round(mjob: MultiJob, backend: str) -> None:
    opts = [*c10d(mjob, "2:3", backend), *last_call(backend)]
    args = ["--busy", "--busy-attempt", "0"]
    procs = start_c10d(mjob, 2, opts, args)  # nodes 0 and 1: a world of 4
    mjob.wait_stamps(range(2 * NPROC), "busy")
    assert mjob.env(0)["WORLD_SIZE"] == "4"
    late = mjob.boxes[2].popen(
        mjob.argv(2, opts, args), cwd=str(REPO), stdout=PIPE, stderr=PIPE, text=True
    )
    ended = finish([*procs, late], mjob.boxes, timeout=240)
    for e in ended:
        assert e.returncode == 0, e.stderr
        for rank in node_ranks(e.node):
            done = f"rank {rank} of 6 done: local {rank % NPROC} node {e.node} of 3 attempt 1"
            assert done in e.stdout, e.stdout
    assert "attempt 0: a node waits to join (--nnodes MIN:MAX)" in ended[0].stderr
    for node in range(NNODES):
        wait_until(lambda n=node: mjob.leftovers(n) == [], 10, f"node {node} cleaned up")
