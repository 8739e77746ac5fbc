"""10. Restarts across nodes: 3 nodes of 2 gloo ranks each, c10d rendezvous on loopback.

Both launchers get the same multi-node flags (torchrun's; the command lines are
`_argv`): `--rdzv-backend c10d --rdzv-endpoint 127.0.0.1:PORT --rdzv-conf
join_timeout=120,last_call_timeout=3 --local-addr 127.0.0.N` (node N-1), and
torchrun `TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1` (without it its restarted ranks
fail: see TORCHRUN_ENV). Node 0 starts first and the others once it serves the
endpoint (on loopback torch lets any node serve it: the first to bind), and
- restart (10a): `--nnodes 3 --max-restarts 1`; global rank 3 raises once all ranks
  are in their all-reduce loop (bench/ranks/node_round.py). Measured from rank 3's
  stamp until every rank of the restarted gang (attempt 1, all 3 nodes) has done its
  first all-reduce: the restarted gang's first step on every node.
- node lost (10b): `--nnodes 2:3 --max-restarts 3`; once all ranks are in their loop,
  every process of the node that is node rank 2 is SIGKILLed at once (its launcher,
  gpulaunch's peer or torchrun's agent, its ranks): a machine gone. Measured from the
  kill until every rank of the smaller world (2 nodes, 4 ranks) has done its first
  all-reduce.
- watcher killed (10c, gpulaunch only): the same, but only node 2's watcher is
  SIGKILLed (its peer tells the others; systemd stops its ranks). torchrun has no
  equivalent: its ranks outlive a killed agent and the job goes on as it was.

torchrun learns of a failure elsewhere by polling the rendezvous (its agent's monitor
loop) or from its own ranks' collective errors; gpulaunch from the store's `cause`
key. Both then meet again through torch's rendezvous: the same code, the same
settings, so the difference is how fast each learns, stops and starts.
"""

from __future__ import annotations

import signal
import socket
import time
from collections.abc import Sequence
from pathlib import Path

from bench import launchers, procs
from bench.context import Context, fmt
from bench.launchers import BIN, LOOPBACK, NODE_GRACE_S, Launcher, Node, Run
from bench.stats import Metric, compared

NNODES, NPROC = 3, 2
FAIL_RANK = 3
CONF = "join_timeout=120,last_call_timeout=3"  # 3: all three meet in the first round
CAP_S = 90.0  # per run: runaway protection, and the most a restart may take here
POLL_S = 0.02  # how often stamp files are looked for (a bench, not the product)


def _argv(
    launcher: Launcher, node: Node, nnodes: str, restarts: int, d: str, backend: str = "c10d"
) -> list[str]:
    rdzv = [
        *("--nnodes", nnodes, "--max-restarts", str(restarts)),
        *("--rdzv-backend", backend, "--rdzv-endpoint", f"{LOOPBACK}:{node.port}"),
        *("--rdzv-id", node.rdzv_id, "--rdzv-conf", CONF, "--local-addr", _addr(node.rank)),
    ]
    script = [launchers.rank_script("node_round"), "--dir", d, "--token", node.token]
    if launcher.ours:
        head = [str(BIN / "gpulaunch"), "start", "--supervisor", launcher.supervisor]
        head += ["--job", node.token, "--grace", str(NODE_GRACE_S), "--nproc", str(NPROC)]
        return [*head, *rdzv, *script]
    return [str(BIN / "torchrun"), *rdzv, "--nproc-per-node", str(NPROC), *script]


def _addr(node: int) -> str:
    """Node N is 127.0.0.N+1 (127/8 is loopback): node 0 alone serves the endpoint, and
    torch's c10d, which orders the nodes by address, makes node N its node rank N."""
    return f"127.0.0.{node + 1}"


# torchrun's ranks read attempt 0's gloo addresses from the store that its agents share
# across rounds (torch 2.13's default) and fail to connect: its restarts work only with
# the rendezvous store not shared, each round's store then made by its rank 0.
TORCHRUN_ENV = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}


def run(ctx: Context) -> list[Metric]:
    restart = Metric("10a", "rank fails on one node → restarted gang's first step, all nodes", "s")
    lost = Metric("10b", "node 2 lost (all its processes) → smaller world's first step", "s")
    watcher = Metric("10c", "node 2's watcher SIGKILLed → smaller world's first step", "s")
    for m in (restart, lost, watcher):
        m.judge = compared("time")
    for rep in range(ctx.config.reps):
        for launcher in ctx.order(rep):
            restart.add(launcher, _once(ctx, launcher, "restart", restart))
            lost.add(launcher, _once(ctx, launcher, "lost", lost))
            if launcher.ours:
                watcher.add(launcher, _once(ctx, launcher, "watcher", watcher))
    watcher.notes.append("torchrun: no equivalent (its ranks outlive a killed agent)")
    return [restart, lost, watcher]


def _once(
    ctx: Context, launcher: Launcher, kind: str, metric: Metric, backend: str = "c10d"
) -> float | None:
    """One run of `kind`: restart, lost (SIGKILL of node 2), frozen (SIGSTOP of node 2),
    watcher; `backend`: gpulaunch's rendezvous (torchrun's is always c10d)."""
    rdzv_id = launchers.new_token("round")
    port = launchers.free_port()
    d = ctx.run_dir("round")
    nnodes, restarts = ("3", 1) if kind == "restart" else ("2:3", 3)
    runs: list[Run] = []
    result: float | None = None
    try:
        for n in range(NNODES):
            node = Node(n, NNODES, port, rdzv_id)
            argv = _argv(launcher, node, nnodes, restarts, str(d), backend)
            if kind == "restart":
                argv += ["--fail-rank", str(FAIL_RANK)]
            env = None if launcher.ours else TORCHRUN_ENV
            runs.append(launchers.spawn(launcher, node.token, argv, ctx.scratch, False, env))
            if n == 0 and not _serving(port, runs[0]):
                ctx.problem(f"rounds {kind} ({launcher}): node 0 did not serve the endpoint")
                return None
        result = _measure(ctx, launcher, kind, runs, d, metric)
    finally:
        if kind == "frozen":  # what was stopped goes now (nobody would wake it)
            for r in runs:
                procs.kill_token(r.token)
        for r in runs:
            if r.exited_at is None:
                r.wait_exit(30)
            ctx.finish(r, f"rounds {kind}", leftovers_expected=result is None or kind == "frozen")
    statuses = "/".join(str(r.returncode) for r in runs)
    ctx.say(f"10 rounds {kind} {launcher}: {fmt(result)} s; statuses {statuses}")
    metric.notes.append(f"{launcher} {kind}: statuses of nodes 0/1/2: {statuses}")
    return result


def _serving(port: int, run: Run) -> bool:
    """Wait until node 0 serves the rendezvous endpoint before the others start: every
    node's address is loopback, and torch lets whichever binds the port first serve it."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not run.wait_exit(0):
        with socket.socket() as s:
            if s.connect_ex((LOOPBACK, port)) == 0:
                return True
        time.sleep(POLL_S)
    return False


def _measure(
    ctx: Context, launcher: Launcher, kind: str, runs: list[Run], d: Path, metric: Metric
) -> float | None:
    deadline = time.monotonic() + CAP_S
    world = NNODES * NPROC
    while len(procs.read_stamps(d, "up")) < world:
        if time.monotonic() > deadline or any(r.wait_exit(0) for r in runs):
            ctx.problem(f"rounds {kind} ({launcher}): the ranks did not all come up")
            return None
        time.sleep(POLL_S)
    victim = None
    if kind == "restart":
        while FAIL_RANK not in (stamps := procs.read_stamps(d, "fail")):
            time.sleep(POLL_S)
        t0, survivors = stamps[FAIL_RANK], world
    if kind != "restart":
        victim = _node_of_group(runs, d, 2)
        if victim is None:
            ctx.problem(f"rounds {kind} ({launcher}): no node rank 2 found")
            return None
        t0 = time.time()
        if kind == "lost":
            procs.kill_token(victim.token)
        elif kind == "frozen":
            procs.signal_token(victim.token, signal.SIGSTOP)
        else:
            victim.proc.kill()  # gpulaunch's watcher itself (the launcher we started)
        survivors = world - NPROC
    deadline = time.monotonic() + CAP_S  # from the event: the start's share is not the cap's
    while len(firsts := procs.read_stamps(d, "first")) < survivors:
        if time.monotonic() > deadline:
            ctx.problem(f"rounds {kind} ({launcher}): {len(firsts)} ranks restarted in {CAP_S} s")
            return None
        time.sleep(POLL_S)
    for r in runs:  # the survivors end by themselves (3 more steps)
        if kind != "frozen" or r is not victim:
            r.wait_exit(60)
    born = procs.read_stamps(d, "born")
    if len(born) == len(firsts):  # how much of it the launcher took: until its last rank ran
        metric.extra.setdefault(f"{launcher}: last rank started", []).append(
            max(born.values()) - t0
        )
    return max(firsts.values()) - t0


def _node_of_group(runs: Sequence[Run], d: Path, group: int) -> Run | None:
    """The launcher whose ranks say GROUP_RANK `group` (c10d numbers the nodes itself)."""
    for value, pid in procs.read_stamps_pids(d, "group").values():
        if int(value) == group:
            cmdline = procs.cmdline(pid) or b""
            for r in runs:
                if r.token.encode() in cmdline:
                    return r
    return None
