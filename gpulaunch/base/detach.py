"""`gpulaunch start --detach`: the watcher runs on in a child; the command returns at once.

`Detached.fork()` forks before anything talks to systemd or the bus (their
connections do not survive a fork). The child starts a session of its own and
runs the watcher, which moves it into the job's watcher scope; its stdin and
stdout are /dev/null, and its stderr is a pipe to the parent until the job's
units exist. The parent copies what comes through the pipe to its own stderr:
either the child's word that the units exist (`started`; the parent prints the
job id and exits 0, and the child's stderr becomes /dev/null), or, if the start
failed, the child's error line followed by its exit (the parent exits with the
child's status; the child has left nothing behind by then). From then on the
job's outcome is on the bus and in its journal record: `gpulaunch wait JOB`.

A SIGINT, SIGTERM or SIGHUP to the parent ends only its wait (128+N, quietly): the
child goes on in its own session (not gpulaunch/__main__.py's "stopped before the
job started", which would not be true).
"""

from __future__ import annotations

import os
import signal
import sys

STARTED = b"\0gpulaunch-started\n"  # never part of a message: it begins with NUL


class _Left(SystemExit):
    """The parent's wait ended by a signal (a SystemExit: quiet wherever it is raised)."""

    def __init__(self, status: int) -> None:
        super().__init__(status)
        self.status = status


def _leave(signum: int, frame: object) -> None:
    raise _Left(128 + signum)


class Detached:
    """One end of the start pipe: the parent's (`is_parent`) or the child's."""

    def __init__(self, pid: int, fd: int | None) -> None:
        self.pid = pid  # the child's pid in the parent; 0 in the child
        self._fd = fd  # the parent's read end; None in the child
        self._previous: dict[int, object] = {}  # the parent's handlers before its wait

    @property
    def is_parent(self) -> bool:
        return self.pid != 0

    @classmethod
    def fork(cls) -> Detached:
        sys.stdout.flush()
        sys.stderr.flush()
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid:
            parent = cls(pid, read_end)
            for stop in (signal.SIGTERM, signal.SIGHUP):
                if signal.getsignal(stop) is not signal.SIG_IGN:
                    parent._previous[stop] = signal.signal(stop, _leave)
            os.close(write_end)
            return parent
        os.close(read_end)
        os.setsid()
        null = os.open(os.devnull, os.O_RDWR)
        os.dup2(null, 0)
        os.dup2(null, 1)
        os.dup2(write_end, 2)
        os.close(null)
        os.close(write_end)
        return cls(0, None)

    def wait_started(self, job: str) -> int:
        """In the parent: pass on the child's messages until it started (print the job
        id, return 0) or exited (return its status)."""
        assert self.is_parent and self._fd is not None
        pending = b""
        try:
            while chunk := os.read(self._fd, 65536):
                pending += chunk
                head, marker, _ = pending.partition(STARTED)
                keep = 0 if marker else tail_overlap(head, STARTED)
                os.write(2, head[: len(head) - keep])
                pending = head[len(head) - keep :]
                if marker:
                    print(job, flush=True)
                    return 0
        except KeyboardInterrupt:  # ^C while we wait: the child goes on in its own session
            return 130
        except _Left as exc:  # SIGTERM, SIGHUP: the same
            return exc.status
        finally:
            for stop, handler in self._previous.items():
                signal.signal(stop, handler)  # type: ignore[arg-type]
            os.close(self._fd)
            self._fd = None
        os.write(2, pending)
        _, status = os.waitpid(self.pid, 0)
        code = os.waitstatus_to_exitcode(status)
        return code if code >= 0 else 128 - code  # killed by signal N: 128+N

    def started(self) -> None:
        """In the child: the job's units exist; let the parent go."""
        sys.stderr.flush()
        os.write(2, STARTED)
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 2)
        os.close(null)


def tail_overlap(data: bytes, marker: bytes) -> int:
    """How many bytes at the end of `data` could begin `marker` (hold them back)."""
    for n in range(min(len(data), len(marker) - 1), 0, -1):
        if marker.startswith(data[-n:]):
            return n
    return 0
