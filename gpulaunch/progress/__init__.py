"""The progress channel, rank side: tell the watcher of each step (docs/progress.md).

    from gpulaunch.progress import step
    for n, batch in enumerate(loader, 1):
        ...
        step(n, total=len(loader) * epochs)
        if n % 100 == 0:
            save(model, f"ckpt-{n}.pt")
            checkpoint(n)  # the steps up to n survive a failure (goodput, docs/progress.md)

Each call sends one sd_notify datagram (`X_GPULAUNCH_STEP=N`, ...) to the socket
`NOTIFY_SOCKET` names (a path, as gpulaunch's watcher gives every rank: a socket only
the job's user can reach; or an `@abstract` name, as sd_notify(3) reads both); without it
(run by anything else) every call is a no-op. A call never blocks and never
raises: a datagram the watcher has no room for is dropped (the next step says
more). Importing this module loads nothing of the launcher (only `os`, `socket`),
so the rank may import it anywhere; the watcher's side of the channel lives in
the modules of this folder, which this one never imports:

- `channel.py`: the job's datagram socket; `socketdir.py`: the private directory it is
  bound in; `protocol.py`: one datagram, read;
- `tracker.py`: one rank's steps, its rate and step time; `behind.py`: where the
  ranks' steps stopped, for a hang by steps;
- `stragglers.py`: which ranks are stragglers, `journal.py`: their journal entries;
- `options.py`: `start --straggler-factor/--straggler-steps`;
- `goodput.py`: the job's goodput (ETTR) and the time each failure cost, from its timeline
  (pure); `timeline.py`: the job `Part` that keeps that timeline (docs/progress.md);
  `phases.py`: where each attempt's start went, from that timeline (pure;
  docs/recovery.md, "Where the time goes").
"""

from __future__ import annotations

import os
import socket

__all__ = ["checkpoint", "notify", "ready", "status", "step", "watchdog"]

# Our fields of the sd_notify protocol (systemd leaves names starting with X_ to others).
STEP = "X_GPULAUNCH_STEP"  # the step the rank just finished (a count: 1 after the first)
TOTAL = "X_GPULAUNCH_TOTAL"  # the steps it expects in all (for an ETA)
STEP_SECONDS = "X_GPULAUNCH_STEP_SECONDS"  # its own time of that step (straggler test)
CHECKPOINT = "X_GPULAUNCH_CHECKPOINT"  # the step a checkpoint just saved holds (goodput)

_sock: socket.socket | None = None
_sock_pid = 0  # the pid that opened _sock: a forked child opens its own


def _address() -> str | bytes | None:
    where = os.environ.get("NOTIFY_SOCKET", "")
    if not where:
        return None
    if where.startswith("@"):  # an abstract socket
        return b"\0" + where[1:].encode()
    return where if where.startswith("/") else None


def notify(text: str) -> bool:
    """Send one sd_notify datagram (`KEY=VALUE` lines); whether it was sent."""
    global _sock, _sock_pid
    address = _address()
    if address is None:
        return False
    try:
        if _sock is None or _sock_pid != os.getpid():
            _sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
            _sock_pid = os.getpid()
        _sock.sendto(text.encode("utf-8", "replace"), socket.MSG_DONTWAIT, address)
        return True
    except OSError:  # the watcher is busy (EAGAIN) or gone: training goes on
        return False


def step(n: int, total: int | None = None, seconds: float | None = None) -> bool:
    """Step `n` is done (a count that grows: the global step). `total`: the steps the
    run expects in all, for an ETA. `seconds`: this rank's own time of the step where
    its wall time says nothing (ranks that wait for each other in a collective all take
    the slowest one's time: measure up to the collective to find a straggler)."""
    lines = [f"{STEP}={int(n)}"]
    if total is not None:
        lines.append(f"{TOTAL}={int(total)}")
    if seconds is not None:
        lines.append(f"{STEP_SECONDS}={float(seconds):.6f}")
    return notify("\n".join(lines))


def checkpoint(n: int) -> bool:
    """A checkpoint of step `n` is safely written: a restart resumes from it, so the steps
    up to `n` are not lost to a later failure (goodput: what a failure cost is the time
    from the last checkpoint). Call it once the checkpoint is durable, not before."""
    return notify(f"{CHECKPOINT}={int(n)}")


def status(text: str) -> bool:
    """A free-form line about the rank (`STATUS=`), shown by `gpulaunch status`."""
    return notify("STATUS=" + " ".join(text.splitlines()))


def ready() -> bool:
    """The rank finished setting up (`READY=1`)."""
    return notify("READY=1")


def watchdog() -> bool:
    """The rank is alive (`WATCHDOG=1`); not a step: --hang-timeout counts only steps."""
    return notify("WATCHDOG=1")
