"""The launcher's side of the warm process: start it, wait for its imports, ask it for ranks.

start.py starts it right after the plan where no keeper is forked after it (the systemd
supervisor asked for, or the direct supervisor's keeper forked already), else the watcher
(watcher/loop.py) starts it first thing; either way before the job's containment exists
(it moves with the watcher into the watcher's scope or cgroup: `pid` is handed to the
supervisor's `create`), waits for its imports only before the first rank is forked
(`ready`, on the watcher's loop: signals are heard meanwhile), and then asks it for each
rank (`spawn`): the rank comes back as a `HeldChild` of the watcher's, at its gate, as
base/procs.py's `spawn_held` makes a cold one. Whenever the warm start is not safe or not
possible, `spawn` returns None and the rank starts cold; `say` tells why, once per reason.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from gpulaunch.base.procs import HeldChild, spawn_held
from gpulaunch.linux import set_subreaper
from gpulaunch.warm.fit import differs, python_command, warm_environment

SERVER = Path(__file__).parent / "rankside" / "server.py"
ROOM = 4096  # bytes of argv the warm process gets, so that a rank's argv shows in `ps`
MAX_MESSAGE = 1 << 22


class WarmProcess:
    """One node's warm process, or (after a failed check) the reason the ranks start cold."""

    def __init__(
        self,
        job: str,
        argv: Sequence[str],
        env: Mapping[str, str],
        modules: Sequence[str],
        say: Callable[[str], None],
    ) -> None:
        self.job = job
        self.python = argv[0]
        self.env = warm_environment(env)  # what every rank shares: set before imports
        self.modules = tuple(modules)
        self.say = say
        self.cold: str | None = python_command(argv, self.python)
        self.ready_seen = False
        self._said: set[str] = set()
        self._child: HeldChild | None = None
        self._sock: socket.socket | None = None

    @property
    def pid(self) -> int | None:
        return self._child.pid if self._child is not None else None

    def start(self) -> int | None:
        """Fork and exec the warm process (it imports at once); its pid, or None: cold.
        Once: start.py starts it as early as it may, else the watcher does."""
        if self._child is not None:
            return self._child.pid
        if self.cold is not None:
            self._off(self.cold)
            return None
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        devnull = os.open(os.devnull, os.O_RDWR)
        try:
            argv = [self.python, "-u", str(SERVER), self.job, ",".join(self.modules), "." * ROOM]
            fds = {0: devnull, 1: devnull, 2: 2, 3: theirs.fileno()}
            # SIGKILLed by the kernel if the watcher dies
            self._child = spawn_held(argv, self.env, fds, death_signal=signal.SIGKILL)
        finally:
            os.close(devnull)
            theirs.close()
        self._child.release()
        self._sock = ours
        return self._child.pid

    async def ready(self) -> None:
        """Wait for its imports (and its check): after this, `spawn` may fork ranks."""
        if self._sock is None or self.ready_seen:
            return
        loop = asyncio.get_running_loop()
        self._sock.setblocking(False)  # asyncio's way; `spawn` waits for its answers
        try:
            said = await loop.sock_recv(self._sock, MAX_MESSAGE)
        finally:  # (cancelled: the job stops before any rank is forked)
            if self._sock is not None:
                self._sock.setblocking(True)
        self.ready_seen = True
        answer = json.loads(said) if said else {"cold": "the warm process ended while importing"}
        if "cold" in answer:
            self._off(str(answer["cold"]))

    def spawn(
        self,
        rank: int,
        argv: Sequence[str],
        env: Mapping[str, str],
        fds: Mapping[int, int],
        death_signal: int,
    ) -> HeldChild | None:
        """Rank `rank`, forked from the warm process and held at its gate; None: start it cold
        (one line said why)."""
        if self._sock is None or not self.ready_seen:
            return None
        why = python_command(argv, self.python) or differs(self.env, env)
        if why is not None:
            self._cold_rank(rank, why)
            return None
        gate_r, gate_w = os.pipe()
        request = {
            "argv": list(argv),
            "env": dict(env),
            "cwd": os.getcwd(),
            "fds": sorted(fds),
            "death_signal": death_signal,
            "watcher": os.getpid(),
        }
        sources = [gate_r, *(fds[t] for t in sorted(fds))]
        was = set_subreaper(True)  # the rank's middle process exits: the rank comes to us
        try:
            socket.send_fds(self._sock, [json.dumps(request).encode()], sources)
            said = self._sock.recv(MAX_MESSAGE)
        except OSError as exc:
            why = f"the warm process cannot be reached ({exc.strerror})"
            said = json.dumps({"cold": why}).encode()
        finally:
            set_subreaper(was)
            os.close(gate_r)
        answer = json.loads(said) if said else {"cold": "the warm process ended"}
        if "pid" not in answer:
            os.close(gate_w)
            self._off(str(answer["cold"]))
            return None
        pid = int(answer["pid"])
        try:
            pidfd = os.pidfd_open(pid)
        except OSError:  # pragma: no cover - ours until we reap it
            os.close(gate_w)
            raise
        return HeldChild(pid=pid, pidfd=pidfd, gate=gate_w)

    def close(self) -> None:
        """End it (a job's end; the kernel does it too if the watcher dies: SIGKILL)."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        if self._child is not None:
            child, self._child = self._child, None
            try:
                signal.pidfd_send_signal(child.pidfd, signal.SIGKILL)
            except ProcessLookupError:
                pass
            try:
                os.waitid(os.P_PIDFD, child.pidfd, os.WEXITED)
            except ChildProcessError:
                pass
            child.close()

    def _off(self, why: str) -> None:
        """No more warm ranks in this job: every rank starts cold, and why, once."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        self._say(f"gpulaunch: warm start off, ranks start cold: {why}")

    def _cold_rank(self, rank: int, why: str) -> None:
        self._say(f"gpulaunch: rank {rank} starts cold: {why}")

    def _say(self, line: str) -> None:
        if line not in self._said:
            self._said.add(line)
            self.say(line)
