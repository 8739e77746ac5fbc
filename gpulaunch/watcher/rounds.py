"""The watcher's side of the other nodes: their failures stop ours, and after a failure
that restarts (gpulaunch/multinode/rounds.py decides) every node's ranks start again,
in the world the nodes' next rendezvous settles (docs/multinode.md)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpulaunch.base.protocol import Layout, NodeFailure
from gpulaunch.errors import GpulaunchError
from gpulaunch.model import JobSpec, Phase
from gpulaunch.multinode.peerlink import Interrupted
from gpulaunch.multinode.rounds import Next
from gpulaunch.plan.spec import JobDraft, number_ranks
from gpulaunch.units.definitions import JobUnits
from gpulaunch.units.job import render_units
from gpulaunch.units.templates import Templates

if TYPE_CHECKING:
    from gpulaunch.watcher.loop import Watcher


def on_elsewhere(watcher: Watcher, failure: NodeFailure) -> None:
    """Another node failed first: stop ours."""
    watcher.output.message(f"gpulaunch: {failure.describe()}; stopping this node's ranks")
    if watcher.phase is not Phase.STARTING:
        watcher._begin_stop()


def next_round(watcher: Watcher) -> bool:
    """After this node's ranks all ended: meet the other nodes again and start the next
    attempt, if the round's failure restarts; False: the job ends here."""
    nodes = watcher.nodes
    assert nodes is not None and nodes.peer.draft is not None
    why, failure = nodes.next, nodes.failure
    if why is None or why is Next.END or failure is None:
        return False
    spec = watcher.spec
    if why is Next.RESTART:
        left = f"restart {nodes.layout.failures + 1} of {spec.max_restarts}"
        doing = "restarting the ranks of every node"
    else:
        left = f"--nnodes {nodes.peer.config.min_nodes}:{nodes.peer.config.nnodes}"
        doing = f"the other nodes go on without node {failure.node}"
        if failure.node < 0:  # another node waits to join
            doing = "every node starts again with it"
    watcher.output.message(f"gpulaunch: {failure.describe()}; {doing} ({left}): meeting them again")
    try:
        layout = nodes.next_round(watcher.wakeup_fd, why)
    except Interrupted as exc:
        watcher.interrupt = (watcher.clock(), exc.exit_code - 128)
        return False
    except GpulaunchError as exc:  # the rendezvous failed (NodeLinkError): said as at start
        watcher.start_error = exc
        return False
    new, units = renumber(nodes.peer.draft, layout)
    renamed = [r.unit for r in new.ranks] != [r.unit for r in spec.ranks]  # the ranks' names
    watcher.spec = new
    watcher.attempt = layout.attempt
    watcher.output.message(
        f"gpulaunch: job {new.job}: attempt {layout.attempt}: node {layout.node_rank} of "
        f"{layout.nnodes}, ranks {layout.first_rank}-{layout.first_rank + new.nproc - 1} "
        f"of {new.world_size}"
    )
    watcher.new_attempt(units if renamed else None)  # systemd: this round's scopes
    return True


def renumber(draft: JobDraft, layout: Layout) -> tuple[JobSpec, JobUnits]:
    """This node's ranks and units in the world the rendezvous settled."""
    spec = number_ranks(draft, layout=layout)
    return spec, render_units(spec, Templates(draft.opts.units_dirs))
