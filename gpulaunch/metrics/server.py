"""The metrics endpoint: a minimal HTTP/1.1 server on the watcher's event loop
(asyncio streams; no thread, no web framework).

`GET /metrics` (or `/`) answers OpenMetrics when the client accepts it (Prometheus
asks for it), else Prometheus' text format 0.0.4 (curl, older scrapers). Keep-alive
as Prometheus uses it. The body is made when asked for: nothing runs between scrapes.

Idle or slow clients cannot deny a scrape (issue 35: 40 idle connections made 24 of 25
scrapes fail): a new connection's request must arrive within `HEAD_TIMEOUT`, a kept one's
next request within `IDLE_TIMEOUT`, and at most `MAX_CLIENTS` connections are kept: when
one more arrives, the connection that has waited longest for a request is dropped to make
room for it (a connection is only ever busy for the moment its answer is written, so
only a newcomer refused while all `MAX_CLIENTS` are mid-answer goes unserved). A scraper
connects and asks at once; whoever holds connections open without asking only ever
evicts their own.
"""

from __future__ import annotations

import asyncio
import errno
import os
import socket
from collections.abc import Callable

from gpulaunch.errors import UnavailableError
from gpulaunch.metrics.options import Listen

IDLE_TIMEOUT = 30.0  # seconds a kept connection may wait for its next request
HEAD_TIMEOUT = 5.0  # seconds a new connection may take to send its first request
MAX_CLIENTS = 16
MAX_HEAD = 16 << 10  # bytes of a request's line and headers

Render = Callable[[bool], tuple[bytes, str]]  # openmetrics? -> (body, content type)


def bind(listen: Listen) -> socket.socket:
    """The listening socket, bound now: a port in use is one line before anything starts."""
    try:
        if listen.host == "::":
            return _every_address(listen.port)
        family, _, _, _, address = socket.getaddrinfo(
            listen.host, listen.port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        return _server(family, address, dualstack=False)
    except socket.gaierror as exc:  # a name that does not resolve
        why = exc.strerror
    except OSError as exc:
        why = os.strerror(exc.errno) if exc.errno else str(exc)  # create_server adds more
    raise UnavailableError(
        f"cannot serve metrics on {listen}: {why}",
        "name an address of this machine and a free port in --metrics-listen "
        "(port 0: any free one, said at the start)",
    )


def _every_address(port: int) -> socket.socket:
    """IPv6 and IPv4 on one socket where the machine has IPv6, else IPv4's every address."""
    if socket.has_dualstack_ipv6():
        try:
            return _server(socket.AF_INET6, ("::", port), dualstack=True)
        except OSError as exc:
            if exc.errno not in (errno.EAFNOSUPPORT, errno.EADDRNOTAVAIL):
                raise  # a port in use is in use for IPv4 too
    return _server(socket.AF_INET, ("0.0.0.0", port), dualstack=False)


def _server(family: int, address: tuple[object, ...], dualstack: bool) -> socket.socket:
    sock = socket.create_server(
        address[:2],
        family=family,
        dualstack_ipv6=dualstack,
        reuse_port=False,
    )
    sock.setblocking(False)
    return sock


def bound_address(sock: socket.socket) -> str:
    """`127.0.0.1:41237`, `[::]:9400`: what the socket listens on (port 0 resolved)."""
    host, port = sock.getsockname()[:2]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class MetricsServer:
    """Serves `render`'s body on `sock` from the loop, until `close`."""

    def __init__(self, sock: socket.socket, render: Render) -> None:
        self.sock = sock
        self.render = render
        self.scrapes = 0
        self._server: asyncio.Server | None = None
        # each connection's writer -> since when it waits for a request (None: answering);
        # insertion order is the order of arrival
        self._clients: dict[asyncio.StreamWriter, float | None] = {}
        self._tasks: set[asyncio.Task[None]] = set()  # a connection each

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, sock=self.sock, limit=MAX_HEAD)

    def _make_room(self) -> bool:
        """Drop the connection that has waited longest for a request; False if every one
        is answering now."""
        waiting = [(since, w) for w, since in self._clients.items() if since is not None]
        if not waiting:
            return False
        _, oldest = min(waiting, key=lambda pair: pair[0])
        del self._clients[oldest]
        oldest.transport.abort()  # its task's read ends at once, and the task with it
        return True

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if len(self._clients) >= MAX_CLIENTS and not self._make_room():
            writer.close()
            return
        loop = asyncio.get_running_loop()
        self._clients[writer] = loop.time()
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        try:
            timeout = HEAD_TIMEOUT
            while await self._one(reader, writer, timeout):
                timeout = IDLE_TIMEOUT
                if writer not in self._clients:  # dropped for a newcomer meanwhile
                    break
                self._clients[writer] = loop.time()
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError):
            pass  # the client went, said too much or nothing, or was dropped for another
        finally:
            self._clients.pop(writer, None)
            if task is not None:
                self._tasks.discard(task)
            writer.close()

    async def _one(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, timeout: float
    ) -> bool:
        """Answer one request; whether the connection stays open for another."""
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout)
        if writer in self._clients:
            self._clients[writer] = None  # answering: not to be dropped for a newcomer
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split()
        headers = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if sep:
                headers[name.strip().lower()] = value.strip()
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            await self._send(writer, 400, b"bad request\n", "text/plain", False, True)
            return False
        method, target, version = parts
        keep = version != "HTTP/1.0" and headers.get("connection", "").lower() != "close"
        if headers.get("content-length", "0") != "0" or "transfer-encoding" in headers:
            keep = False  # a body we will not read: the next request could not be found
        if method not in ("GET", "HEAD"):
            await self._send(writer, 405, b"GET only\n", "text/plain", False, keep)
        elif target.split("?", 1)[0] not in ("/metrics", "/"):
            await self._send(writer, 404, b"see /metrics\n", "text/plain", False, keep)
        else:
            self.scrapes += 1
            body, kind = self.render("application/openmetrics-text" in headers.get("accept", ""))
            await self._send(writer, 200, body, kind, method == "HEAD", keep)
        return keep

    @staticmethod
    async def _send(
        writer: asyncio.StreamWriter, code: int, body: bytes, kind: str, head: bool, keep: bool
    ) -> None:
        reason = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed"}
        writer.write(
            (
                f"HTTP/1.1 {code} {reason[code]}\r\nContent-Type: {kind}\r\n"
                f"Content-Length: {len(body)}\r\n"
                f"Connection: {'keep-alive' if keep else 'close'}\r\n\r\n"
            ).encode()
            + (b"" if head else body)
        )
        await asyncio.wait_for(writer.drain(), HEAD_TIMEOUT)  # a scraper reads at once

    def close(self) -> None:
        """Stop listening and drop every connection (their tasks end at the loop's next turn)."""
        if self._server is not None:
            self._server.close()
        else:
            self.sock.close()
        for task in list(self._tasks):
            task.cancel()

    async def aclose(self) -> None:
        """`close`, and wait for every connection's task to end: none is left pending when
        the watcher closes its loop (asyncio would say so on stderr)."""
        tasks = list(self._tasks)
        self.close()
        await asyncio.gather(*tasks, return_exceptions=True)
