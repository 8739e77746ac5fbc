"""`gpulaunch setup`: install the system side from the installed package itself.

What it installs is optional: a job runs without it, with a warning naming this command.
- the D-Bus policy (always): a system job's watcher may own io.gpulaunch.job.*, so
  `gpulaunch status/stop/wait` and busctl see the job (docs/dbus.md);
- with `--journald`, journald's rate-limit drop-in: journald keeps every line of chatty
  ranks (journald.conf(5)); journald reads it when it restarts, which happens only
  with `--restart-journald` (a restart closes every service's log stream).

- `gpulaunch.slice` (always), for the system manager and every user manager: the parent of
  all jobs, with the settings an admin tunes for all of them together (all commented out:
  installing it changes nothing until they are set; each job's own settings are in its
  templates, units/); the system manager reloads, user managers read it at their next
  daemon-reload;
- tmpfiles.d's entry for /run/gpulaunch (always), root's jobs' runtime directory, created now
  and at every boot.

All of it comes from the package's copy of the repository's packaging/ (gpulaunch.shipped).

Idempotent (a file that holds what the package ships is left alone), `--uninstall`
removes what it installed, and every line it prints says what it changed.
"""

from __future__ import annotations

import argparse
import asyncio
import errno
import os
import stat
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpulaunch.errors import (
    AccessDeniedError,
    GpulaunchError,
    SystemdError,
    UnavailableError,
    UsageError,
)
from gpulaunch.system.files import (
    ALL,
    BUS_POLICY,
    DEFAULT,
    JOURNALD_DROP_IN,
    SYSTEM_SLICE,
    TMPFILES,
    SystemFile,
)

JOURNALD = "systemd-journald.service"


@dataclass(frozen=True)
class Change:
    """What `setup` did to one file: installed, updated, unchanged, removed, absent."""

    what: str
    path: Path

    def line(self) -> str:
        return f"gpulaunch setup: {self.what} {self.path}"


def install(file: SystemFile, root: Path) -> Change:
    """Put the shipped file in place (atomically), unless it is there already."""
    target = file.at(root)
    if target.is_dir():
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(target))
    if file.installed(root):
        return Change("unchanged", target)
    what = "updated" if target.exists() else "installed"
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.gpulaunch-tmp")
    try:
        tmp.write_bytes(file.source.read_bytes())
        tmp.chmod(0o644)
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)  # nothing left behind
        raise
    return Change(what, target)


def uninstall(file: SystemFile, root: Path) -> Change:
    """Remove the file `install` put there."""
    target = file.at(root)
    try:
        target.unlink()
    except FileNotFoundError:
        return Change("absent", target)
    return Change("removed", target)


def _apply(act: Callable[[SystemFile, Path], Change], file: SystemFile, args: Any) -> Change:
    """`act` on one file; what is in the way (a directory, a file where a directory
    goes, /proc, a read-only file system) is one line: exit 2 under --root, else 69."""
    root: Path = args.root or Path("/")
    try:
        return act(file, root)
    except OSError as exc:
        path = exc.filename or file.at(root)
        what = f"cannot {'remove' if args.uninstall else 'install'} {file.at(root)}"
        reason = f"{path}: {exc.strerror}" if str(path) != str(file.at(root)) else exc.strerror
        hint = "move what is in the way, or choose another --root"
        if args.root is not None:
            raise UsageError(f"{what}: {reason}", hint) from None
        raise UnavailableError(f"{what}: {reason}", "move what is in the way") from None


def reload_bus_config() -> str:
    """Ask the system bus to reread its policy now (dbus-broker does not watch the files)."""
    from dbus_fast import Message, MessageType

    from gpulaunch.jobapi.bus import DBUS, DBUS_PATH, connect
    from gpulaunch.model import Manager

    async def call() -> Any:
        bus = await connect(Manager.SYSTEM)
        try:
            return await bus.call(
                Message(destination=DBUS, path=DBUS_PATH, interface=DBUS, member="ReloadConfig")
            )
        finally:
            bus.disconnect()

    try:
        reply = asyncio.run(call())
    except GpulaunchError as exc:
        return (
            f"the system bus is not reachable ({exc.message}); it reads the policy when it starts"
        )
    if reply.message_type is not MessageType.METHOD_RETURN:
        raise SystemdError(
            f"the system bus did not reload its configuration: {reply.error_name}",
            "restart dbus, or reboot, for the policy to apply",
        )
    return "the system bus reloaded its configuration"


def run_tool(argv: list[str], done: str) -> str:
    """Run a systemd tool after a change; what happened, in words (a failure is not fatal:
    the file is in place, and applies at the next reload or boot)."""
    try:
        res = subprocess.run(argv, capture_output=True, text=True, check=False)
    except OSError as exc:
        return f"could not run {argv[0]} ({exc.strerror}); it applies at the next boot"
    if res.returncode != 0:
        why = res.stderr.strip().splitlines()[-1] if res.stderr.strip() else res.returncode
        return f"{' '.join(argv)} failed ({why}); it applies at the next boot"
    return done


def restart_journald() -> str:
    """Restart journald so that it reads the drop-in (it has no reload for this)."""
    done = subprocess.run(
        ["systemctl", "restart", JOURNALD], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise SystemdError(
            f"could not restart {JOURNALD}: {done.stderr.strip() or done.returncode}",
            f"restart it yourself: systemctl restart {JOURNALD}",
        )
    return f"restarted {JOURNALD}"


def chosen(args: argparse.Namespace) -> Sequence[SystemFile]:
    """The files this run is about: all of them to uninstall, else the defaults (+ journald)."""
    if args.uninstall:
        return ALL
    return (*DEFAULT, JOURNALD_DROP_IN) if args.journald else DEFAULT


def _check_root(root: Path) -> None:
    """--root is a directory (else one line, exit 2)."""
    try:
        st = root.stat()
    except OSError as exc:
        what = "does not exist" if exc.errno == errno.ENOENT else exc.strerror
        raise UsageError(f"--root {root}: {what}", "give a directory to install under") from None
    if not stat.S_ISDIR(st.st_mode):
        raise UsageError(f"--root {root} is not a directory", "give a directory to install under")


def cmd_setup(args: argparse.Namespace) -> int:
    root: Path = args.root or Path("/")
    on_machine = args.root is None
    if args.restart_journald:
        args.journald = True
    if args.uninstall and args.journald and not args.restart_journald:
        raise UsageError("--journald has no meaning with --uninstall", "uninstall removes all")
    if on_machine and os.geteuid() != 0:
        raise AccessDeniedError(
            "gpulaunch setup writes into /etc", "run it as root: sudo gpulaunch setup"
        )
    if args.root is not None:
        _check_root(root)
    act = uninstall if args.uninstall else install
    changes = {file: _apply(act, file, args) for file in chosen(args)}
    for change in changes.values():
        print(change.line(), flush=True)
    changed = {file for file, c in changes.items() if c.what not in ("unchanged", "absent")}
    if not changed:
        print("gpulaunch setup: nothing to change")
    if not on_machine:
        return 0
    if BUS_POLICY in changed:
        print(f"gpulaunch setup: {reload_bus_config()}")
    if SYSTEM_SLICE in changed:
        print(f"gpulaunch setup: {run_tool(['systemctl', 'daemon-reload'], 'reloaded systemd')}")
    if TMPFILES in changed and not args.uninstall:
        created = run_tool(
            ["systemd-tmpfiles", "--create", TMPFILES.target], "created /run/gpulaunch"
        )
        print(f"gpulaunch setup: {created}")
    if JOURNALD_DROP_IN in changed or (args.restart_journald and JOURNALD_DROP_IN in changes):
        if args.restart_journald:
            print(f"gpulaunch setup: {restart_journald()}")
        else:
            print(
                "gpulaunch setup: journald applies its new rate limit when it restarts: "
                "gpulaunch setup --journald --restart-journald (or reboot)"
            )
    return 0
