"""The addresses a node is given, checked before it joins: one line where torch would wait.

torch retries a name that does not resolve until its timeout, in silence (the store's
address), or hands it to the ranks, which then do (this node's own name under c10d).
"""

from __future__ import annotations

import socket


class UnresolvableHost(Exception):
    """This node's own name does not resolve: torch would hand it to the ranks anyway."""


def check_own_name(host: str) -> None:
    """Fail at once where torch's c10d rendezvous would wait: an address nobody can resolve.

    Without --local-addr, torch gives node 0's FQDN to every rank as MASTER_ADDR
    (and to Gloo); a name that does not resolve makes them retry in silence until
    their timeout.
    """
    if (why := _unresolved(host)) is not None:
        raise UnresolvableHost(
            f"this node's name {host!r} does not resolve to an address ({why}), and "
            "torch would give it to the ranks; pass --local-addr with an address the nodes "
            "reach (e.g. --local-addr 127.0.0.1 on one node), or add the name to /etc/hosts"
        )


def check_endpoint(endpoint: str) -> None:
    """Fail at once where torch's store would retry until its timeout: a name that does
    not resolve (a typo in --master-addr or --rdzv-endpoint)."""
    host = endpoint.rsplit(":", 1)[0].strip("[]")
    if (why := _unresolved(host)) is not None:
        raise UnresolvableHost(
            f"the rendezvous address {host!r} does not resolve to an address ({why}); "
            "give every node the same address of the node that serves it"
        )


def _unresolved(host: str) -> str | None:
    """Why `host` does not resolve to an address, or None where it does."""
    try:
        socket.getaddrinfo(host, None)
    except OSError as exc:
        return exc.strerror or str(exc)
    return None
