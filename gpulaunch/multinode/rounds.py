"""Restarts across nodes: when every node goes on to another round (docs/multinode.md).

A round is one rendezvous of the nodes and one attempt of their ranks. When the
round's first failure (the store's `cause`, the same on every node) is one that
restarts, every node stops its ranks and meets the others again through torch's
rendezvous, as torchrun's elastic agent does; the peer (peer.py) does the meeting,
this module decides whether to (gpulaunch/watcher/rounds.py starts the round). Pure.
A rank's failure is classified and judged by recovery/ (`status_class`, `RestartPolicy.allows`), as
on a single node: a new failure class is recovery/'s alone.
"""

from __future__ import annotations

import enum

from gpulaunch.base.protocol import (
    JOINING_NODE,
    NODE_LOST_STATUS,
    Layout,
    NodeConfig,
    NodeFailure,
)
from gpulaunch.recovery.failure import status_class
from gpulaunch.recovery.settings import RestartPolicy

DEFAULT_POLICY = RestartPolicy()


class Next(enum.Enum):
    """What follows a round that ended with a failure."""

    END = "end"  # the job ends on every node
    RESTART = "restart"  # a rank failed (or a node of a fixed-size c10d job was lost)
    REGROUP = "regroup"  # --nnodes MIN:MAX: a node was lost or waits to join: meet again


def after_failure(
    failure: NodeFailure,
    layout: Layout,
    config: NodeConfig,
    max_restarts: int,
    policy: RestartPolicy = DEFAULT_POLICY,
) -> Next:
    """What every node does after the round's first failure (each decides the same: the
    same failure from the store, and the same flags on every node)."""
    if failure.rank is not None:  # a rank failed, on whichever node
        # recovery/ classifies it and applies --restart-on, --no-restart-exit-code
        if not policy.allows(status_class(failure.status), failure.status):
            return Next.END
        return Next.RESTART if layout.failures < max_restarts else Next.END
    if failure.node == JOINING_NODE:  # a late or returning node (peer.py): not a failure
        return Next.REGROUP
    lost = failure.status == NODE_LOST_STATUS and failure.node >= 0
    if not lost or failure.node == layout.node_rank or not config.backend.elastic:
        return Next.END  # interrupted, this node's own loss, or a static job's missing node
    if config.min_nodes is not None and config.min_nodes < config.nnodes:
        # A change of membership, not a failure of the script: as torchrun, it does not
        # count against --max-restarts; torch's rendezvous waits for MIN (join_timeout).
        return Next.REGROUP
    return Next.RESTART if layout.failures < max_restarts else Next.END
