"""The progress channel, watcher side: one datagram socket per job (docs/progress.md).

The watcher binds an `AF_UNIX`/`SOCK_DGRAM` socket in a private directory of the
job's user (mode 0700, socketdir.py), so that no other user can reach it, not even
to fill its queue (issue 35: an abstract name let anyone who reads /proc/net/unix
flood it), and gives its path to every rank as `NOTIFY_SOCKET`. Scopes have no
notify socket of their own (systemd reads notifications only for services), so
nothing else listens there. `SO_PASSCRED` makes the kernel stamp every datagram
with its sender's pid: the sender is a rank's main process, a process in the
rank's own cgroup (its scope), or a descendant of its main process; anything else
is dropped, and a datagram of another user (root, the only other who can reach the
directory) is dropped before anything is read for it. What a datagram says of its
rank is never read: a rank cannot speak for another.

The loop reads it like every other fd (no thread, no timer while nobody
reports). Observers hear of steps at most once a second (`NOTIFY_EVERY`), of a
straggler's flag at once.
"""

from __future__ import annotations

import asyncio
import os
import socket
import struct
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path
from typing import Protocol

from gpulaunch.base.cgroup import cgroup_of
from gpulaunch.base.procs import HeldChild
from gpulaunch.model import JobSpec, RankSpec, StepInfo
from gpulaunch.progress.journal import StragglerNote, note_straggler
from gpulaunch.progress.protocol import Notice, parse
from gpulaunch.progress.socketdir import SocketDir
from gpulaunch.progress.stragglers import Stragglers, Verdict
from gpulaunch.progress.tracker import StepTracker

NOTIFY_EVERY = 1.0  # seconds: observers hear of steps at most this often
BATCH = 256  # datagrams read per wake-up, so that nothing else waits long
MAX_DATAGRAM = 4096  # bytes read of one (sd_notify's are a line or two)
MAX_FDS = 16  # passed fds (FDSTORE=1 is not ours) are read to be closed
_UCRED = struct.Struct("iII")  # pid, uid, gid


class Reporter(Protocol):
    """A rank as the channel needs it (watcher/ranks.py's `Rank`)."""

    spec: RankSpec
    child: HeldChild | None
    cgroup: Path | None
    steps: StepInfo | None
    status_text: str | None


def _parent(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rfind(b")") + 2 :].split()
    return int(fields[1]) if len(fields) > 1 else None


def sender_of(pid: int, ranks: Sequence[Reporter]) -> Reporter | None:
    """The rank whose process `pid` is (the kernel's word, SO_PASSCRED), or None."""
    mains = {r.child.pid: r for r in ranks if r.child is not None}
    if pid in mains:
        return mains[pid]
    group = cgroup_of(pid)
    if group is not None:
        for rank in ranks:
            if rank.cgroup is not None and rank.cgroup == group:
                return rank
    up = pid
    for _ in range(64):  # no cgroup of its own (the direct supervisor): its ancestry
        parent = _parent(up)
        if parent is None or parent <= 1:
            return None
        if parent in mains:
            return mains[parent]
        up = parent
    return None


class ProgressChannel:
    """The job's notify socket and what its ranks said through it."""

    def __init__(
        self,
        spec: JobSpec,
        ranks: Callable[[], Sequence[Reporter]],
        say: Callable[[str], None] = lambda text: None,
        journal: bool = True,
        clock: Callable[[], float] = time.monotonic,
        base: Path | None = None,
    ) -> None:
        """`base`: the job's runtime base (/run, $XDG_RUNTIME_DIR) whose gpulaunch/ holds
        the socket's private directory (socketdir.py)."""
        self.spec = spec
        self.say = say
        self.journal = journal  # journald is reachable: a straggler gets its entry
        self.clock = clock
        self.sock = socket.socket(
            socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC | socket.SOCK_NONBLOCK
        )
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        self.directory: SocketDir | None = None
        try:
            self.directory = SocketDir(self.sock, base)
            self.address = self.directory.address
        except OSError:  # no private directory anywhere: an abstract name, reachable by all
            self.sock.bind("")  # autobind: a name the kernel picks
            name = self.sock.getsockname()
            self.address = "@" + (name[1:].decode() if isinstance(name, bytes) else name[1:])
        self.strangers = 0  # datagrams from processes of no rank (dropped)
        self._uid = os.geteuid()  # the ranks' user: the watcher's (they are its children)
        self._ranks = ranks
        self._changed: Callable[[], None] = lambda: None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pending: asyncio.TimerHandle | None = None
        self._seen: Sequence[Reporter] | None = None  # the attempt's ranks the state is of
        self._trackers: dict[int, StepTracker] = {}
        self.stragglers = Stragglers(spec.stragglers)

    def environment(self) -> dict[str, str]:
        """What a rank needs to report."""
        return {"NOTIFY_SOCKET": self.address}

    def attach(
        self,
        stack: ExitStack,
        loop: asyncio.AbstractEventLoop,
        watch: Callable[[int, Callable[[], None]], None],
        changed: Callable[[], None],
    ) -> None:
        """Read the socket on `loop` until `stack` closes it; `changed` tells the observers."""
        self._loop, self._changed = loop, changed
        stack.callback(self.close)
        watch(self.sock.fileno(), self._on_readable)

    def close(self) -> None:
        if self._pending is not None:
            self._pending.cancel()
            self._pending = None
        if self._loop is not None and self.sock.fileno() >= 0:
            self._loop.remove_reader(self.sock.fileno())
        self.sock.close()
        if self.directory is not None:
            self.directory.close()

    # -- reading ------------------------------------------------------------

    def _on_readable(self) -> None:
        for _ in range(BATCH):
            try:
                data, ancdata, flags, _ = self.sock.recvmsg(
                    MAX_DATAGRAM, socket.CMSG_SPACE(_UCRED.size) + socket.CMSG_SPACE(4 * MAX_FDS)
                )
            except (BlockingIOError, InterruptedError):
                return
            pid = uid = None
            for level, kind, payload in ancdata:
                if level != socket.SOL_SOCKET:
                    continue
                if kind == socket.SCM_CREDENTIALS and len(payload) >= _UCRED.size:
                    pid, uid, _ = _UCRED.unpack_from(payload)
                elif kind == socket.SCM_RIGHTS:
                    for (fd,) in struct.iter_unpack("i", payload[: len(payload) // 4 * 4]):
                        os.close(fd)
            if pid is None or flags & socket.MSG_TRUNC:
                continue
            if uid != self._uid:  # not our ranks' user: not even /proc is read for it
                self.strangers += 1
                continue
            self.take(pid, parse(data))

    def take(self, pid: int, notice: Notice) -> None:
        """What process `pid` said (the kernel's pid, never the datagram's word)."""
        ranks = self._ranks()
        if ranks is not self._seen:  # a new attempt (--max-restarts): a fresh start
            self._seen = ranks
            self._trackers.clear()
            self.stragglers = Stragglers(self.spec.stragglers)
        rank = sender_of(pid, ranks)
        if rank is None:
            self.strangers += 1
            return
        number = rank.spec.rank
        if notice.status is not None and notice.status != rank.status_text:
            rank.status_text = notice.status
            self._soon()
        tracker = self._trackers.setdefault(number, StepTracker())
        if notice.checkpoint is not None:  # (goodput.py: what a failure after it costs)
            at = self.clock()
            tracker.saved(notice.checkpoint, at)
            if notice.step is None and rank.steps is not None:
                rank.steps = replace(rank.steps, checkpoint=notice.checkpoint, checkpoint_at=at)
                self._soon()
        if notice.step is None:
            return
        sample = tracker.report(notice.step, notice.total, self.clock(), notice.step_seconds)
        verdict = None
        if sample is not None:
            others = {
                n: t.step_seconds
                for n, t in self._trackers.items()
                if n != number and t.step_seconds is not None
            }
            verdict = self.stragglers.judge(number, sample, others)
        rank.steps = tracker.info(
            number in self.stragglers.flagged, self.stragglers.times.get(number, 0)
        )
        if verdict is None:
            self._soon()
        else:
            self._flagged(rank, verdict)

    # -- telling ------------------------------------------------------------

    def _soon(self) -> None:
        """The observers hear of it within NOTIFY_EVERY (one call for a burst)."""
        if self._pending is None and self._loop is not None:
            self._pending = self._loop.call_later(NOTIFY_EVERY, self._now)

    def _now(self) -> None:
        if self._pending is not None:
            self._pending.cancel()
            self._pending = None
        self._changed()

    def _flagged(self, rank: Reporter, verdict: Verdict) -> None:
        steps = rank.steps
        note = StragglerNote(
            job=self.spec.job,
            rank=verdict.rank,
            unit=rank.spec.unit,
            straggler=verdict.straggler,
            seconds=verdict.seconds,
            others=verdict.others,
            step=steps.step if steps is not None else 0,
            rule=self.spec.stragglers,
        )
        self.say("gpulaunch: " + note.message())
        if self.journal:
            note_straggler(note)
        self._now()
