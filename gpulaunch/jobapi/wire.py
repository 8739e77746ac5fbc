"""The job's composite values as D-Bus wire tuples (and back): its nodes and its goodput,
for the job object's properties (view.py) and the journal record's JSON (record.py)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gpulaunch.base.protocol import NodeInfo
from gpulaunch.model import AttemptPhases, Goodput, Loss

# known (false: no rank reported a step), wall, productive and startup seconds, whether a
# checkpoint was reported, each failure: attempt, redone, detection, stop, restart (-1: none)
GOODPUT_SIGNATURE = "(bdddba(idddd))"


def goodput_wire(goodput: Goodput | None) -> list[Any]:
    if goodput is None:
        return [False, 0.0, 0.0, 0.0, False, []]
    losses = [
        [x.attempt, x.redone, x.detection, x.stop, -1.0 if x.restart is None else x.restart]
        for x in goodput.losses
    ]
    return [True, goodput.wall, goodput.productive, goodput.startup, goodput.checkpoints, losses]


def goodput_from_wire(wire: Sequence[Any] | None) -> Goodput | None:
    if not wire or not wire[0]:
        return None
    _, wall, productive, startup, checkpoints, losses = wire
    return Goodput(
        wall=float(wall),
        productive=float(productive),
        startup=float(startup),
        checkpoints=bool(checkpoints),
        losses=tuple(
            Loss(int(a), float(r), float(d), float(s), None if t < 0 else float(t))
            for a, r, d, s, t in losses
        ),
    )


# each attempt: attempt (0: the first), since ("failure" or "start"), each phase seen:
# its name and seconds since then (docs/recovery.md, "Where the time goes")
PHASES_SIGNATURE = "a(isa(sd))"


def phases_wire(phases: Sequence[AttemptPhases]) -> list[Any]:
    return [[p.attempt, p.since, [[n, v] for n, v in p.phases]] for p in phases]


def phases_from_wire(wire: Sequence[Any] | None) -> tuple[AttemptPhases, ...]:
    return tuple(
        AttemptPhases(int(a), str(since), tuple((str(n), float(v)) for n, v in phases))
        for a, since, phases in wire or ()
    )


NODE_SIGNATURE = "(isuuu)"  # node, host, first rank, ranks, watcher pid


def node_wire(node: NodeInfo) -> list[Any]:
    return [node.node, node.host, node.first_rank, node.nproc, node.pid]


def node_from_wire(wire: Sequence[Any]) -> NodeInfo:
    node, host, first, nproc, pid = wire
    return NodeInfo(
        node=int(node), host=str(host), first_rank=int(first), nproc=int(nproc), pid=int(pid)
    )
