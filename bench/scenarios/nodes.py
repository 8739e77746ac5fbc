"""8. Many nodes on one machine: N launchers × 8 plain-Python ranks on loopback (N = 2, 8, 32).

Each node is one launcher process on this machine (gpulaunch's direct supervisor: N systemd
boxes would be too heavy; torchrun beside it at the same N), joined by the static
rendezvous node 0 serves on loopback (bench/launchers.py's node command lines). The ranks
(bench/ranks/node_up.py) stamp their first statement, then sleep. Measured, per N:

- rendezvous: from the first launcher's start to the last of the N × 8 ranks' stamps;
- a rank on the last node fails (the job's last global rank exits 1 on a cue file): from
  the cue to the moment no process of the job is left on any node (launchers included);
- SIGTERM to every node's launcher (how a scheduler stops a job): from the first signal to
  the moment no process of the job is left.

We wait at most `node_cap_s` for the end; what is left then is counted as not gone and
killed. The growth with N is in the notes: seconds per further node between the
smallest and the largest N.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

from bench import launchers, procs
from bench.context import Context, fmt
from bench.launchers import Launcher, Node, Run
from bench.stats import Metric, compared

NPROC = 8  # ranks per node
POLL_S = 0.01


def run(ctx: Context) -> list[Metric]:
    cfg = ctx.config
    metrics: list[Metric] = []
    growth: dict[tuple[str, Launcher], dict[int, float]] = {}
    for i, nnodes in enumerate(cfg.nodes_sizes):
        letters = "abc" if i == 0 else ("def" if i == 1 else "ghi")
        up = Metric(
            f"8{letters[0]}",
            f"{nnodes} nodes × {NPROC}: start → every rank's first line",
            "s",
            judge=compared("time"),
        )
        fail = Metric(
            f"8{letters[1]}",
            f"{nnodes} nodes × {NPROC}: a rank on the last node fails → all gone",
            "s",
            judge=compared("time"),
        )
        term = Metric(
            f"8{letters[2]}",
            f"{nnodes} nodes × {NPROC}: SIGTERM to every node → all gone",
            "s",
            judge=compared("time"),
        )
        for rep in range(cfg.nodes_reps):
            for launcher in ctx.order(rep):
                for mode, metric in (("fail", fail), ("term", term)):
                    up_s, end_s = _once(ctx, launcher, nnodes, mode)
                    metric.add(launcher, end_s)
                    if mode == "fail":
                        up.add(launcher, up_s)
                    ctx.say(
                        f"8 nodes {nnodes} rep {rep + 1}/{cfg.nodes_reps} {launcher} {mode}: "
                        f"all up {fmt(up_s)} s, all gone {fmt(end_s)} s"
                    )
        for metric, what in ((up, "up"), (fail, "fail"), (term, "term")):
            for launcher in metric.ran():
                median = metric.summary(launcher).median
                if median is not None:
                    growth.setdefault((what, launcher), {})[nnodes] = median
        metrics += [up, fail, term]
    if metrics and len(cfg.nodes_sizes) > 1:
        lo, hi = min(cfg.nodes_sizes), max(cfg.nodes_sizes)
        for (what, launcher), by_n in sorted(growth.items()):
            if lo in by_n and hi in by_n:
                per_node = (by_n[hi] - by_n[lo]) / (hi - lo)
                metrics[0].notes.append(
                    f"growth, {what}, {launcher}: {per_node * 1000:.1f} ms per further node "
                    f"({fmt(by_n[lo])} s at {lo} nodes, {fmt(by_n[hi])} s at {hi})"
                )
    return metrics


def _once(
    ctx: Context, launcher: Launcher, nnodes: int, mode: str
) -> tuple[float | None, float | None]:
    cfg = ctx.config
    rdzv_id = launchers.new_token(f"nodes{nnodes}")
    stamps = ctx.run_dir(rdzv_id)
    port = launchers.free_port()
    args = ["--dir", str(stamps), *(["--fail"] if mode == "fail" else [])]
    runs: list[Run] = []
    try:
        for node in range(nnodes):
            runs.append(
                ctx.start_node(launcher, Node(node, nnodes, port, rdzv_id), NPROC, "node_up", args)
            )
        started = min(r.started_at for r in runs)
        up_at = _all_up(stamps, nnodes * NPROC, started + cfg.run_cap_s)
        if up_at is None:
            ctx.problem(
                f"nodes {nnodes} ({launcher}): not every rank up within {cfg.run_cap_s:g} s"
            )
            return None, None
        time.sleep(0.5)  # every launcher settled in its steady state
        cue = time.time()
        if mode == "fail":
            Path(stamps, "fail").touch()
        else:
            for r in runs:
                r.signal(signal.SIGTERM)
        gone = procs.wait_gone(rdzv_id, cfg.node_cap_s, interval=POLL_S)
        if gone is None:
            ctx.problem(
                f"nodes {nnodes} {mode} ({launcher}): processes left after {cfg.node_cap_s:g} s"
            )
        return up_at - started, None if gone is None else gone - cue
    finally:
        for r in runs:
            ctx.finish(r, f"nodes {nnodes} {mode}", leftovers_expected=True)
        procs.kill_token(rdzv_id)


def _all_up(stamps: Path, n: int, deadline: float) -> float | None:
    """The last rank's stamp once all n ranks stamped; None at the deadline."""
    while time.time() < deadline:
        got = procs.read_stamps(stamps, "ready")
        if len(got) >= n:
            return max(got.values())
        time.sleep(POLL_S)
    return None
