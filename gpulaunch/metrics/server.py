"""The metrics endpoint: a minimal HTTP/1.1 server on the watcher's event loop
(asyncio streams; no thread, no web framework).

`GET /metrics` (or `/`) answers OpenMetrics when the client accepts it (Prometheus
asks for it), else Prometheus' text format 0.0.4 (curl, older scrapers). Keep-alive
as Prometheus uses it; a client that says nothing for `IDLE_TIMEOUT` is dropped, and
at most `MAX_CLIENTS` are served at once, so a slow or hostile client cannot hold
the watcher. The body is made when asked for: nothing runs between scrapes.
"""

from __future__ import annotations

import asyncio
import errno
import os
import socket
from collections.abc import Callable

from gpulaunch.errors import UnavailableError
from gpulaunch.metrics.options import Listen

IDLE_TIMEOUT = 30.0  # seconds a connection may wait for its next request
MAX_CLIENTS = 16
MAX_HEAD = 16 << 10  # bytes of a request's line and headers

Render = Callable[[bool], tuple[bytes, str]]  # openmetrics? -> (body, content type)


def bind(listen: Listen) -> socket.socket:
    """The listening socket, bound now: a port in use is one line before anything starts."""
    try:
        if not listen.host:
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
        self._clients: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()  # a connection each

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, sock=self.sock, limit=MAX_HEAD)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if len(self._clients) >= MAX_CLIENTS:
            writer.close()
            return
        self._clients.add(writer)
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        try:
            while await self._one(reader, writer):
                pass
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError):
            pass  # the client went, said too much or nothing: it is dropped
        finally:
            self._clients.discard(writer)
            if task is not None:
                self._tasks.discard(task)
            writer.close()

    async def _one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        """Answer one request; whether the connection stays open for another."""
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), IDLE_TIMEOUT)
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
        await asyncio.wait_for(writer.drain(), IDLE_TIMEOUT)

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
