"""The membership file: each round's members, told to the ranks (docs/multinode.md).

The peer (peer.py) writes it the moment a round's membership is decided (state
`running`) and again the moment the round's first failure is known (state `ending`, with
the node that left and why), at the path the ranks find in `GPULAUNCH_MEMBERSHIP_FILE`.
Written whole (a temporary file renamed over it): a reader sees one version or the next,
never part of one. Libraries that can shrink a communicator instead of rebuilding it need
who left; torch's environment only says how many remain.
"""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any

from gpulaunch.base.protocol import JOINING_NODE, Layout, NodeFailure, NodeInfo

VERSION = 1


def _node(info: NodeInfo) -> dict[str, Any]:
    return {
        "node": info.node,
        "host": info.host,
        "ranks": list(range(info.first_rank, info.first_rank + info.nproc)),
    }


def _same(a: NodeInfo, b: NodeInfo) -> bool:
    """One node in two rounds (its node rank may change): its host and watcher."""
    return (a.host, a.pid) == (b.host, b.pid)


def membership(
    layout: Layout,
    previous: Layout | None,
    cause: NodeFailure | None,
    state: str,
    decided_at: float | None,
) -> dict[str, Any]:
    """What the file says: this round (`layout`), and who of `previous` is not in it."""
    left = []
    if previous is not None:
        for old in previous.nodes:
            if any(_same(old, new) for new in layout.nodes):
                continue
            why = "not in the new round"
            if cause is not None and cause.node == old.node and cause.host == old.host:
                why = cause.what
            left.append({**_node(old), "why": why})
    if state == "ending" and cause is not None and 0 <= cause.node < len(layout.nodes):
        if cause.rank is None:  # a node ended or was lost (not one of its ranks)
            left.append({**_node(layout.nodes[cause.node]), "why": cause.what})
    return {
        "version": VERSION,
        "run_id": layout.run_id,
        "generation": layout.attempt,
        "state": state,
        "decided_at": decided_at,
        "written_at": time.time(),
        "this_node": layout.node_rank,
        "world_size": layout.world_size,
        "nodes": [_node(n) for n in layout.nodes],
        "left": left,
        "cause": None if cause is None or cause.node == JOINING_NODE else cause.what,
        "cause_node": None if cause is None or cause.node < 0 else cause.node,
        "cause_rank": None if cause is None else cause.rank,
    }


def write(path: str, data: dict[str, Any]) -> None:
    """Replace the file at `path` whole (readable by the ranks, whoever they run as)."""
    tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps(data, indent=1) + "\n")
    os.replace(tmp, path)


def remove(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
