"""`python -m sdbox vm build|boot|shell|run|ssh`: the VM lab from a shell.

  build                     build the cached image if missing; print its directory
  shell [USER]              boot a fresh VM, a login shell in it as USER (root), stop it
  run [--user U] -- CMD     boot a fresh VM, run CMD there over SSH as U, stop it; CMD's status
  boot                      boot a VM with this checkout and keep it until ^C (prints how to ssh)
  ssh [--vm DIR] USER -- CMD  run CMD (or a shell) as USER in the VM that `boot` keeps

Every boot gets the current checkout (the directory you run this in) at /src.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from sdbox.vm.image import ROOT, VMError, ensure
from sdbox.vm.machine import SSH_OPTIONS, USERS, Machine


def main(argv: Sequence[str]) -> int:
    args = _parser().parse_args(argv)
    try:
        return int(args.func(args))
    except VMError as e:
        print(f"sdbox vm: error: {e}", file=sys.stderr)
        return 1


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m sdbox vm", description="A Debian 12 VM for tests (qemu)."
    )
    verbs = parser.add_subparsers(dest="verb", required=True)
    b = verbs.add_parser("build", help="build the cached image if missing")
    b.set_defaults(func=_build)
    s = verbs.add_parser("shell", help="a login shell in a fresh VM")
    s.add_argument("user", nargs="?", default="root", choices=USERS)
    s.set_defaults(func=_shell)
    r = verbs.add_parser("run", help="run CMD in a fresh VM (use -- before CMD)")
    r.add_argument("--user", default="root", choices=USERS)
    r.add_argument("cmd", nargs="+", metavar="CMD")
    r.set_defaults(func=_run)
    k = verbs.add_parser("boot", help="boot a VM and keep it until interrupted")
    k.set_defaults(func=_boot)
    h = verbs.add_parser("ssh", help="run CMD as USER in the VM that `boot` keeps")
    h.add_argument("--vm", type=Path, help="its state directory (when several run)")
    h.add_argument("user", choices=USERS)
    h.add_argument("cmd", nargs="*", metavar="CMD")
    h.set_defaults(func=_ssh)
    return parser


def _build(args: argparse.Namespace) -> int:
    print(ensure().dir)
    return 0


def _shell(args: argparse.Namespace) -> int:
    with Machine(checkout=Path.cwd()) as vm:
        return subprocess.call(vm.ssh_command(args.user, tty=True))


def _run(args: argparse.Namespace) -> int:
    with Machine(checkout=Path.cwd()) as vm:
        return subprocess.call([*vm.ssh_command(args.user), *args.cmd])


def _boot(args: argparse.Namespace) -> int:
    with Machine(checkout=Path.cwd()) as vm:
        assert vm.state is not None and vm.image is not None
        (vm.state / "port").write_text(f"{vm.port}\n")
        (vm.state / "key").write_text(f"{vm.image.key}\n")
        (vm.state / "pid").write_text(f"{os.getpid()}\n")
        print(f"VM up: python -m sdbox vm ssh --vm {vm.state} USER -- CMD  (^C stops it)")
        signals = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}
        signal.pthread_sigmask(signal.SIG_BLOCK, signals)  # taken by sigwait, not handlers
        signal.sigwait(signals)
    return 0


def _ssh(args: argparse.Namespace) -> int:
    state = args.vm
    if state is None:
        running = [p.parent for p in ROOT.glob("run-*/port") if _alive(p.parent)]
        if len(running) != 1:
            found = ", ".join(map(str, running)) or "none"
            raise VMError(f"need exactly one VM kept by `boot` (found: {found}); pass --vm DIR")
        state = running[0]
    port = (state / "port").read_text().strip()
    key = (state / "key").read_text().strip()
    tty = ["-t"] if not args.cmd and sys.stdin.isatty() else []
    cmd = ["ssh", *SSH_OPTIONS, "-i", key, "-p", port, *tty, f"{args.user}@127.0.0.1"]
    return subprocess.call([*cmd, *args.cmd])


def _alive(state: Path) -> bool:
    try:
        os.kill(int((state / "pid").read_text()), 0)
    except (OSError, ValueError):
        return False
    return True
