"""A Lightning rank's end under strategy="gpulaunch": its gloo process group let go of
before the interpreter's teardown, and never a hang for it.

torch 2.13 aborts about one exit in fifteen ("terminate called without an active
exception", SIGABRT) when a gloo group is alive at interpreter exit; torchrun shows the
same on the same script. A rank that ends well lets go at exit (`release_at_exit`).

A rank that fails in `fabric.launch(fn)` ends at once, with the status its exception
means (its traceback printed first, as Python does): its own status must survive
(sys.exit(7) stays 7, never SIGABRT), and letting go of the group is no way to it, as
`destroy_process_group()` can block for good while the other ranks wait for this one
in a collective (seen in CI: a 300 s hang). The watcher stops the gang at its exit; what
the script would have done after `fabric.launch` returned is moot for a failed rank. A
rank that failed (Trainer: Lightning caught it) is not released at exit either.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import traceback

RELEASE_TIMEOUT = 5.0


class _State:
    registered = False
    failed = False


def release_at_exit() -> None:
    """From the strategy's setup, in every rank: let go at exit (once)."""
    if not _State.registered:
        atexit.register(_at_exit)
        _State.registered = True


def _at_exit() -> None:
    if not _State.failed:  # a failing rank let go already, or must not wait for it now
        release(RELEASE_TIMEOUT)


def failing(exc: BaseException) -> None:
    """The rank fails with `exc` in fabric.launch(fn): it ends now, with its status (an
    exit with status 0 and an interrupt are no failure: they go on as Python's)."""
    if "GPULAUNCH_JOB" not in os.environ:  # not a rank gpulaunch started: Python's way
        return
    if isinstance(exc, KeyboardInterrupt) or (
        isinstance(exc, SystemExit) and exc.code in (0, None)
    ):
        return
    _State.failed = True
    exit_now(exc)


def mark_failed() -> None:
    """Lightning caught the rank's failure (Trainer): no release at exit, where the other
    ranks may still wait in a collective."""
    _State.failed = True


def release(timeout: float) -> bool:
    """destroy_process_group(), bounded: True once it returned (or there was none)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return True
    done = threading.Event()

    def destroy() -> None:
        try:
            dist.destroy_process_group()
        except Exception:  # noqa: BLE001, S110 - the rank's own end is what matters now
            pass
        finally:
            done.set()

    threading.Thread(target=destroy, name="gpulaunch-release", daemon=True).start()
    return done.wait(timeout)


def exit_status(exc: BaseException) -> int:
    """The status Python gives a process that `exc` ends (its message said as Python does)."""
    if isinstance(exc, SystemExit):
        if exc.code is None:
            return 0
        if isinstance(exc.code, int):
            return exc.code & 0xFF
        print(exc.code, file=sys.stderr)
        return 1
    traceback.print_exception(exc)
    return 1


def exit_now(exc: BaseException) -> None:
    status = exit_status(exc)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(status)
