"""torch's rendezvous as the peer (peer.py) uses it across rounds: where a round's keys
live, what a late node needs of a round, leaving a round, the peer's fd limit."""

from __future__ import annotations

import resource
import time
import uuid
from typing import Any

from gpulaunch.base.protocol import JOINING_NODE, NODE_LOST_STATUS, Backend, NodeFailure

NOFILE_IF_UNLIMITED = 1 << 20  # fs.nr_open's default: an unlimited hard limit is no soft one


def take_hard_nofile() -> None:
    """Soft RLIMIT_NOFILE up to the hard limit: the store this peer may serve holds a
    connection per peer (4) and per rank of every node; at the user's usual 1024 it
    would refuse them beyond about 85 nodes of 8 ranks. The peer starts no process."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = hard if hard != resource.RLIM_INFINITY else NOFILE_IF_UNLIMITED
    if soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))


def round_prefix(backend: Backend, info: Any, attempt: int) -> str:
    """Where one round's keys live in the job's store, the same on every node of it.

    static: the attempt (every node restarts every time); c10d: a token the round's
    first node leaves in torch's own store of the round (a node that joins late has no
    count of ours, but torch's round is the same for all).
    """
    if backend is Backend.STATIC:
        return f"a{attempt}/"
    token: bytes = info.store.compare_set("gpulaunch/round", "", uuid.uuid4().hex)
    return f"r{token.decode()}/"


def share_bootstrap(info: Any) -> None:
    """Tell a node that joins in a later round where the ranks' store is, as torch's node
    rank 0 does only in the round where it made that store: torch 2.13's next_rendezvous
    on a late or spare node waits for these keys of its round until its timeout."""
    from torch.distributed.elastic.rendezvous.api import RendezvousStoreInfo as Keys

    boot = info.bootstrap_store_info
    info.store.set(Keys.MASTER_ADDR_KEY, boot.master_addr)
    info.store.set(Keys.MASTER_PORT_KEY, str(boot.master_port))


def joining() -> NodeFailure:
    what = "a node waits to join (--nnodes MIN:MAX): the nodes meet again to take it in"
    return NodeFailure(node=JOINING_NODE, host="", status=NODE_LOST_STATUS, what=what)


def leave_rendezvous(handler: Any) -> None:
    """A node that ends leaves torch's round at once, so that the others' next round does
    not wait for its keep-alive to expire (c10d; torch has no public call for it; ours:
    its shutdown)."""
    if getattr(handler, "get_backend", lambda: "")() == "gpulaunch":
        handler.shutdown()
        return
    try:
        from torch.distributed.elastic.rendezvous.dynamic_rendezvous import _RendezvousExitOp

        deadline = time.monotonic() + handler._settings.timeout.close.total_seconds()
        handler._op_executor.run(_RendezvousExitOp(), deadline)
    except Exception:  # noqa: BLE001 - static, or another torch: the keep-alive expires
        pass
