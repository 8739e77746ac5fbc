"""The watcher's end of the peer process (gpulaunch/multinode/peer.py).

Messages are JSON lines on a socketpair; the peer's exit shows on its pidfd.
Nothing here blocks except `join`, which runs before the job's units exist.
"""

from __future__ import annotations

import os
import selectors
import socket
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpulaunch.base.interrupts import INTERRUPTS, pending
from gpulaunch.base.procs import HeldChild, WaitStatus, kill_held, reap, spawn_held
from gpulaunch.base.protocol import (
    Command,
    Event,
    Layout,
    NodeConfig,
    NodeFailure,
    decode,
    encode,
)
from gpulaunch.errors import GpulaunchError, NodeLinkError
from gpulaunch.model import signal_name

if TYPE_CHECKING:  # only its name: the import chain stays short (tests/unit/test_layout.py)
    from gpulaunch.plan.spec import JobDraft


class Interrupted(GpulaunchError):
    """A signal arrived before the job started (while the nodes were meeting)."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"interrupted by {signal_name(signum)} while waiting for the other nodes")
        self.exit_code = 128 + signum


@dataclass
class PeerLink:
    child: HeldChild
    sock: socket.socket
    config: NodeConfig
    draft: JobDraft | None = None  # to number the ranks of each round (multinode/rounds.py)
    exited: WaitStatus | None = None
    closed: bool = False  # the peer closed its end
    _buffer: bytes = field(default=b"", repr=False)
    _early: list[tuple[str, dict[str, Any]]] = field(default_factory=list, repr=False)

    @classmethod
    def spawn(cls, config: NodeConfig, draft: JobDraft | None = None) -> PeerLink:
        ours, theirs = socket.socketpair()
        env = {**os.environ, "TORCH_CPP_LOG_LEVEL": "ERROR"}
        try:
            argv = (
                sys.executable,
                "-m",
                "gpulaunch.multinode.peer",
                config.to_json(),
                str(os.getpid()),
            )
            child = spawn_held(argv, env, {3: theirs.fileno()})
        finally:
            theirs.close()
        child.release()
        ours.setblocking(False)
        return cls(child=child, sock=ours, config=config, draft=draft)

    @property
    def pid(self) -> int:
        return self.child.pid

    @property
    def pidfd(self) -> int:
        return self.child.pidfd

    def fileno(self) -> int:
        return self.sock.fileno()

    def join(self, wakeup_fd: int) -> Layout:
        """Wait until the rendezvous completes: the layout, or an error saying why not."""
        with selectors.DefaultSelector() as sel:
            sel.register(self.sock, selectors.EVENT_READ)
            sel.register(wakeup_fd, selectors.EVENT_READ)
            sel.register(self.pidfd, selectors.EVENT_READ)
            while True:
                for key, _ in sel.select():
                    if key.fileobj == wakeup_fd:
                        for signum in pending(wakeup_fd):
                            if signum in INTERRUPTS:  # a notice (SIGUSR1) waits for ranks
                                raise Interrupted(signum)
                        continue
                    messages = self.receive()
                    for i, (kind, body) in enumerate(messages):
                        if kind == Event.JOINED:
                            self._early = messages[i + 1 :]  # the round's, for the loop
                            return Layout.from_dict(body["layout"])
                        if kind == Event.ERROR:
                            raise self._join_error(body["message"])
                    if key.fileobj == self.pidfd:
                        status = self.reap()
                        raise self._join_error(f"it exited ({status.describe()}) without a word")

    def _join_error(self, why: str) -> NodeLinkError:
        cfg = self.config
        return NodeLinkError(
            f"could not join the other nodes through the {cfg.backend} rendezvous at "
            f"{cfg.endpoint}: {why}",
            "check that every node runs the same command and can reach that address, "
            "and that the port is free on the node that serves it",
        )

    def receive(self) -> list[tuple[str, dict[str, Any]]]:
        """The complete messages waiting on the link (none once it is closed)."""
        while True:
            try:
                chunk = self.sock.recv(65536)
            except BlockingIOError:
                break
            except OSError:
                chunk = b""
            if not chunk:
                self.closed = True
                break
            self._buffer += chunk
        lines = self._buffer.split(b"\n")
        self._buffer = lines.pop()
        early, self._early = self._early, []
        return early + [decode(line) for line in lines if line]

    def tell_failed(self, failure: NodeFailure) -> None:
        self._send(encode(Command.FAILED, failure=failure.to_dict()))

    def tell_finish(self) -> None:
        self._send(encode(Command.FINISH))

    def tell_next_round(self, attempt: int, failures: int) -> None:
        self._send(encode(Command.NEXT_ROUND, attempt=attempt, failures=failures))

    def _send(self, data: bytes) -> None:
        try:
            self.sock.setblocking(True)
            self.sock.sendall(data)
        except OSError:
            pass  # the peer is gone; its pidfd says so
        finally:
            self.sock.setblocking(False)

    def reap(self) -> WaitStatus:
        if self.exited is None:
            self.exited = reap(self.pidfd)
        return self.exited

    def close(self) -> None:
        """Make sure the peer is gone (on every path out of the job)."""
        if self.exited is None and self.pidfd >= 0:
            kill_held(self.child)
            self.reap()
        self.child.close()
        self.sock.close()
