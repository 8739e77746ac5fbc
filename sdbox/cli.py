"""`python -m sdbox run [--bind PATH]... -- CMD...` and `python -m sdbox shell`
(and `python -m sdbox vm ...`, the VM lab: sdbox/vm/cli.py).

Runs CMD under a real systemd: directly where the host's PID 1 is systemd, else inside
a box booted for the occasion, which binds the current directory, keeps the cwd and
the environment, and is always torn down. The exit status is CMD's (128+N when a
signal N ended it). SIGINT, SIGTERM and SIGHUP sent to sdbox are passed on to CMD,
once: a terminal's ^C reaches CMD by itself (same foreground process group) and is
not passed on again. Until CMD starts, such a signal aborts the boot (exit 128+N).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from types import FrameType

from sdbox.box import SIGNALS, Box, BoxError, host_systemd_running
from sdbox.procs import children

# si_code of a signal sent by a process (kill(2), sigqueue(3)) is <= 0; the kernel's
# own, such as the terminal's ^C to the foreground process group, have SI_KERNEL.
SI_USER = 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["vm"]:  # the VM lab (sdbox/vm/)
        from sdbox.vm.cli import main as vm_main

        return vm_main(argv[1:])
    args = _parser().parse_args(argv)
    command = args.cmd if args.verb == "run" else ["bash", "-i"]
    try:
        return _run(command, binds=args.bind, name=args.name, keep_tmp=args.keep_tmp)
    except BoxError as e:
        print(f"sdbox: error: {e}", file=sys.stderr)
        return 1


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m sdbox", description="Run a command under a throwaway systemd."
    )
    verbs = parser.add_subparsers(dest="verb", required=True)
    run = verbs.add_parser("run", help="run CMD under systemd (use -- before CMD)")
    shell = verbs.add_parser("shell", help="an interactive shell in a box")
    for sub in (run, shell):
        sub.add_argument(
            "--bind",
            action="append",
            default=[],
            metavar="PATH",
            help="also bind PATH into the box (the current directory always is)",
        )
        sub.add_argument("--name", help="box name (default: unique)")
        sub.add_argument(
            "--keep-tmp", action="store_true", help="keep the box's state directory (its log)"
        )
    run.add_argument("cmd", nargs="+", metavar="CMD")
    return parser


def _run(command: list[str], binds: list[str], name: str | None, keep_tmp: bool) -> int:
    if host_systemd_running():
        try:
            os.execvp(command[0], command)
        except OSError as e:
            raise BoxError(f"cannot run {command[0]}: {e.strerror}") from None
    # Signals ignored on entry (a background job of a shell) stay ignored, as in sh(1).
    handled = [sig for sig in SIGNALS if signal.getsignal(sig) != signal.SIG_IGN]
    received: list[int] = []

    def abort_boot(signum: int, frame: FrameType | None) -> None:
        # Only until the command starts: unwinds Box.__enter__, which tears down.
        received.append(signum)
        raise KeyboardInterrupt

    for sig in handled:
        signal.signal(sig, abort_boot)
    box = Box(name=name, binds=[os.getcwd(), *binds], keep_tmp=keep_tmp)
    try:
        with box:
            # From here on signals are events, read by _forward; teardown is not cut short.
            mask = signal.pthread_sigmask(signal.SIG_BLOCK, [*handled, signal.SIGCHLD])
            print(f"sdbox: systemd booted in {box.boot_seconds:.2f} s", file=sys.stderr)
            return _forward(box, command, handled, mask)
    except KeyboardInterrupt:
        print("sdbox: interrupted", file=sys.stderr)
        return 128 + (received[-1] if received else signal.SIGINT)
    finally:
        if keep_tmp:
            print(f"sdbox: box log kept in {box.log_path}", file=sys.stderr)


def _forward(
    box: Box, command: list[str], handled: list[signal.Signals], mask: Iterable[int]
) -> int:
    """Run command in the box, pass on the signals sent to us, return its exit status."""

    def child_setup() -> None:
        # nsenter does not pass signals on, and dies of the terminal's ^C (sent to the
        # whole foreground process group, the command included): it ignores them.
        for sig in SIGNALS:
            signal.signal(sig, signal.SIG_IGN)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)

    # Inside: a shell restores default handling for the command and reports a death by
    # signal N as 128+N (nsenter, ignoring the signal, could not re-raise it).
    names = ",".join(sig.name.removeprefix("SIG") for sig in handled)
    env = ["env", f"--default-signal={names}"] if names else ["env"]
    wrapped = ["sh", "-c", f'{" ".join(env)} -- "$@"; exit $?', "sdbox", *command]
    proc = subprocess.Popen(box.command(wrapped), preexec_fn=child_setup)
    waited = {*handled, signal.SIGCHLD}
    pending: dict[int, float] = {}  # signal -> until when to wait for the command to take it
    try:
        while proc.poll() is None:
            if pending:
                info = signal.sigtimedwait(waited, 0.005)
            else:
                info = signal.sigwaitinfo(waited)
            if info is not None and info.si_signo in handled and info.si_code <= SI_USER:
                pending[info.si_signo] = time.monotonic() + 2.0
            for sig, until in list(pending.items()):
                if _pass_on(proc.pid, sig, force=time.monotonic() > until):
                    del pending[sig]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode if proc.returncode >= 0 else 128 - proc.returncode


def _pass_on(nsenter: int, sig: int, force: bool) -> bool:
    """Send sig to the command (nsenter -> sh -> command); False to try again later.

    Just started, the command still ignores sig (inherited from nsenter) until env has
    reset it: wait for that, a moment at most.
    """
    sent = False
    for pid in _grandchildren(nsenter):
        if force or not _ignores(pid, sig):
            try:
                os.kill(pid, sig)
                sent = True
            except ProcessLookupError:
                pass
    return sent or force


def _ignores(pid: int, sig: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return True
    mask = next(line.split()[1] for line in status.splitlines() if line.startswith("SigIgn:"))
    return bool(int(mask, 16) & (1 << (sig - 1)))


def _grandchildren(pid: int) -> list[int]:
    return [grandchild for child in children(pid) for grandchild in children(child)]
