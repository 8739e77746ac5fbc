"""The watcher's side of the other nodes' rounds: after a failure that restarts
(gpulaunch/multinode/rounds.py decides), this node meets the others again and its ranks
start again, in the world the nodes' next rendezvous settles (docs/multinode.md).

Free of the watcher: `next_round` is told what it needs and answers with the next
round's world; the watcher (loop.py) takes it on."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from gpulaunch.base.protocol import Layout
from gpulaunch.model import JobSpec
from gpulaunch.multinode.othernodes import OtherNodes
from gpulaunch.multinode.rounds import Next
from gpulaunch.plan.spec import JobDraft, number_ranks
from gpulaunch.units.definitions import JobUnits
from gpulaunch.units.job import render_units
from gpulaunch.units.templates import Templates


@dataclass(frozen=True)
class NextRound:
    """This node's ranks in the next round's world (`units`: only where they were renamed)."""

    spec: JobSpec
    units: JobUnits | None
    attempt: int


def next_round(
    nodes: OtherNodes, spec: JobSpec, wakeup_fd: int, say: Callable[[str], None]
) -> NextRound | None:
    """After this node's ranks all ended: meet the other nodes again, if the round's failure
    restarts; None: the job ends here. Raises the peer's `Interrupted` (a signal while
    waiting) and the rendezvous' `GpulaunchError`."""
    assert nodes.peer.draft is not None
    why, failure = nodes.next, nodes.failure
    if why is None or why is Next.END or failure is None:
        return None
    if why is Next.RESTART:
        left = f"restart {nodes.layout.failures + 1} of {spec.max_restarts}"
        doing = "restarting the ranks of every node"
    else:
        left = f"--nnodes {nodes.peer.config.min_nodes}:{nodes.peer.config.nnodes}"
        doing = f"the other nodes go on without node {failure.node}"
        if failure.node < 0:  # another node waits to join
            doing = "every node starts again with it"
    say(f"gpulaunch: {failure.describe()}; {doing} ({left}): meeting them again")
    layout = nodes.next_round(wakeup_fd, why)
    new, units = renumber(nodes.peer.draft, layout)
    renamed = [r.unit for r in new.ranks] != [r.unit for r in spec.ranks]  # the ranks' names
    say(
        f"gpulaunch: job {new.job}: attempt {layout.attempt}: node {layout.node_rank} of "
        f"{layout.nnodes}, ranks {layout.first_rank}-{layout.first_rank + new.nproc - 1} "
        f"of {new.world_size}"
    )
    return NextRound(new, units if renamed else None, layout.attempt)  # systemd: its scopes


def renumber(draft: JobDraft, layout: Layout) -> tuple[JobSpec, JobUnits]:
    """This node's ranks and units in the world the rendezvous settled."""
    spec = number_ranks(draft, layout=layout)
    return spec, render_units(spec, Templates(draft.opts.units_dirs))
