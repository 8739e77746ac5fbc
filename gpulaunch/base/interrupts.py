"""SIGINT, SIGTERM and SIGHUP (stops), SIGUSR1, SIGUSR2 (notices for the ranks,
Slurm's `--signal=USR1@90`) and SIGCONT (`fg`) as bytes on a socket that an event loop
selects on."""

from __future__ import annotations

import os
import signal
import socket

INTERRUPTS = frozenset({signal.SIGINT, signal.SIGTERM, signal.SIGHUP})
NOTICES = frozenset({signal.SIGUSR1, signal.SIGUSR2})  # passed on to the ranks; the job goes on
RESUMED = signal.SIGCONT  # `fg`: the terminal may be ours to read again (base/stdin.py)


def install_wakeup() -> int:
    """Route the interrupts to a socket; its read end, for the loop."""
    read_end, write_end = socket.socketpair()
    for sock in (read_end, write_end):
        sock.setblocking(False)
    signal.set_wakeup_fd(write_end.detach(), warn_on_full_buffer=False)
    for signum in INTERRUPTS | NOTICES | {RESUMED}:
        signal.signal(signum, lambda *_: None)
    return read_end.detach()


def ignore_interrupts() -> None:
    """The job's status is decided: from now on no interrupt may change it.

    Ignored, not just handled: at interpreter shutdown Python puts the default
    action back for every signal it has a handler for, and a SIGTERM then
    would end the process with 143 after a report that said otherwise.
    """
    for signum in INTERRUPTS:
        signal.signal(signum, signal.SIG_IGN)


def pending(wakeup_fd: int) -> list[int]:
    """The interrupts and notices that arrived since the last call, in order (others dropped)."""
    try:
        data = os.read(wakeup_fd, 64)
    except BlockingIOError:
        return []
    return [signum for signum in data if signum in INTERRUPTS | NOTICES | {RESUMED}]
