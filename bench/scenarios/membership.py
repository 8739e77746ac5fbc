"""10g. A node lost under gpulaunch's own rendezvous (`--rdzv-backend gpulaunch`, issue 37).

Scenario 10's jobs (bench/scenarios/rounds.py: 3 nodes of 2 gloo ranks on loopback,
`--nnodes 2:3 --max-restarts 3`, `--rdzv-conf join_timeout=120,last_call_timeout=3`),
with gpulaunch's nodes meeting through gpulaunch's own rendezvous on torch's store
(gpulaunch/multinode/membership.py: a silent node is out within `--node-timeout`, 2 s, and
the next round closes once every node alive has joined) and torchrun's through torch's
c10d, as before. Once all ranks are in their all-reduce loop,
- lost (10g, row 10d): every process of node rank 2 is SIGKILLed (a machine gone);
- frozen (10h, row 10e): every process of node rank 2 is SIGSTOPped (a machine hung: its sockets
  stay open).
Measured from the signal until every rank of the smaller world (2 nodes, 4 ranks) has
done its first all-reduce.
"""

from __future__ import annotations

from bench.context import Context
from bench.scenarios.rounds import _once
from bench.stats import Metric, compared

BACKEND = "gpulaunch"


def run(ctx: Context) -> list[Metric]:
    """10g: node 2 lost (SIGKILL)."""
    lost = Metric("10d", "node 2 lost (all SIGKILLed) → smaller world's 1st step", "s")
    return [_runs(ctx, lost, "lost")]


def run_frozen(ctx: Context) -> list[Metric]:
    """10h: node 2 frozen (SIGSTOP)."""
    frozen = Metric("10e", "node 2 frozen (all SIGSTOPped) → smaller world's 1st step", "s")
    return [_runs(ctx, frozen, "frozen")]


def _runs(ctx: Context, metric: Metric, kind: str) -> Metric:
    metric.judge = compared("time")
    for rep in range(ctx.config.reps):
        for launcher in ctx.order(rep):
            backend = BACKEND if launcher.ours else "c10d"
            metric.add(launcher, _once(ctx, launcher, kind, metric, backend))
    metric.notes.append("gpulaunch: --rdzv-backend gpulaunch (--node-timeout 2); torchrun: c10d")
    return metric
