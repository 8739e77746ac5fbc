"""A throwaway systemd ("the box") for hosts where systemd is installed but not PID 1.

The box is systemd booted as PID 1 of fresh mount/pid/cgroup/uts/ipc namespaces, on
an overlay of the host's root with fresh tmpfs on /run, /tmp and /var/log/journal.
Recipe and pitfalls: sdbox/README.md. One change from that recipe: the box
gets a /dev of its own (a tmpfs with the host's nodes bound in, as systemd-nspawn
does) instead of the host's, because systemd writes into /dev (sdbox/inner.sh).
"""

from __future__ import annotations

import os
import re
import secrets
import select
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from sdbox.procs import WaitError, cmdline, first_child, wait_until

PREFIX = "sdbox-"
TARGET = "sdbox.target"
SYSTEMD = "/lib/systemd/systemd"
INNER = Path(__file__).with_name("inner.sh")
CLEAN_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# Units that touch the kernel (shared with the host) or hardware the box does not have.
MASKED = (
    "systemd-udevd.service",
    "systemd-udevd-control.socket",
    "systemd-udevd-kernel.socket",
    "systemd-udev-trigger.service",
    "systemd-udev-settle.service",
    "systemd-sysctl.service",
    "systemd-modules-load.service",
    "systemd-binfmt.service",
    "proc-sys-fs-binfmt_misc.automount",
    "systemd-hwdb-update.service",
    "systemd-remount-fs.service",
    "systemd-timesyncd.service",
    "console-getty.service",
    "systemd-tmpfiles-setup-dev.service",
    "kmod-static-nodes.service",
    "dev-hugepages.mount",
    "dev-mqueue.mount",
    "sys-kernel-config.mount",
    "sys-kernel-debug.mount",
    "sys-kernel-tracing.mount",
    "sys-fs-fuse-connections.mount",
)

# Paths the box mounts afresh: a bind there would be hidden, or emptied by tmpfiles.
FRESH = ("/proc", "/sys", "/dev", "/run", "/tmp", "/var/log/journal")

BOOT_TIMEOUT = 60.0
STALE_AGE = 10.0  # seconds; a younger empty box cgroup may be one that is starting
SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9-]{0,39}")  # also the hostname's tail


class BoxError(Exception):
    """A user-facing, one-line reason why the box cannot run."""


def host_systemd_running() -> bool:
    """True when the host's PID 1 is a running systemd (sd_booted(3))."""
    try:
        comm = Path("/proc/1/comm").read_text().strip()
    except OSError:
        return False
    return comm == "systemd" and Path("/run/systemd/system").is_dir()


def cgroup2_root() -> Path:
    """Where this host mounts the cgroup2 hierarchy (pure cgroup2, or hybrid's unified)."""
    for path in (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/unified")):
        if (path / "cgroup.controllers").exists():  # only cgroup2 has this file
            return path
    raise BoxError("no cgroup2 hierarchy at /sys/fs/cgroup or /sys/fs/cgroup/unified")


def _populated(cgroup: Path) -> bool:
    return "populated 1" in (cgroup / "cgroup.events").read_text()


def _remove_cgroup_tree(cgroup: Path, deadline: float) -> None:
    """rmdir the tree depth-first, retrying while the kernel reaps the processes."""
    while True:
        try:
            for dirpath, _, _ in os.walk(cgroup, topdown=False):
                try:
                    os.rmdir(dirpath)
                except FileNotFoundError:
                    pass
            return
        except OSError as e:  # EBUSY: still populated
            if time.monotonic() > deadline:
                raise BoxError(f"cannot remove cgroup {cgroup}: {e.strerror}") from None
            time.sleep(0.005)


def _state_dir(name: str) -> Path:
    return Path(tempfile.gettempdir()) / f"{PREFIX}{name}"


def _remove_state_dir(path: Path) -> None:
    # The box's mounts live in its own mount namespace; refuse if one leaked into ours.
    if path.is_dir() and not path.is_symlink() and not os.path.ismount(path / "mnt"):
        shutil.rmtree(path, ignore_errors=True)


def clean_stale_boxes(cg_root: Path, min_age: float = STALE_AGE, pattern: str = "*") -> list[str]:
    """Remove cgroups (and state dirs) of earlier boxes whose systemd is gone.

    Only empty cgroups sdbox-PATTERN at least min_age seconds old are touched; nothing
    is killed. Returns the names of the cgroups removed.
    """
    removed = []
    for cgroup in cg_root.glob(f"{PREFIX}{pattern}"):
        try:
            if _populated(cgroup) or time.time() - cgroup.stat().st_ctime < min_age:
                continue
            _remove_cgroup_tree(cgroup, deadline=0.0)
        except (OSError, BoxError):
            continue  # in use again, or removed by someone else
        _remove_state_dir(_state_dir(cgroup.name.removeprefix(PREFIX)))
        removed.append(cgroup.name)
    return removed


@contextmanager
def _signals_blocked() -> Iterator[None]:
    """Hold back SIGINT/SIGTERM/SIGHUP (delivered afterwards), so teardown completes."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def hosts_file(hostname: str, host_file: Path = Path("/etc/hosts")) -> str:
    """The host's /etc/hosts plus the box's own name, as every real host has it
    (Debian's 127.0.1.1): torch hands a node's FQDN to its ranks and Gloo resolves it."""
    try:
        text = host_file.read_text()
    except OSError:
        text = "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"
    if text and not text.endswith("\n"):
        text += "\n"
    return text + f"127.0.1.1\t{hostname}\n"


def _target_unit(wants: Sequence[str]) -> str:
    lines = [
        "[Unit]",
        "Description=sdbox boot target",
        "Requires=dbus.socket systemd-journald.socket",
        "After=dbus.socket systemd-journald.socket",
        *(f"Wants={unit}" for unit in wants),
        "AllowIsolate=yes",
    ]
    return "\n".join(lines) + "\n"


def _check_bind(path: str | Path) -> str:
    resolved = Path(path).resolve()
    if not resolved.exists():
        raise BoxError(f"bind path {path} does not exist")
    text = str(resolved)
    for fresh in ("/", *FRESH):
        if text == fresh or (fresh != "/" and text.startswith(fresh + "/")):
            raise BoxError(f"cannot bind {text}: the box mounts {fresh} afresh")
    return text


def _check_file(relpath: str) -> str:
    parts = Path(relpath).parts
    if not parts or Path(relpath).is_absolute() or ".." in parts:
        raise BoxError(f"box file {relpath!r} must be a relative path inside the box")
    return relpath


class Box:
    """A booted systemd in fresh namespaces; a context manager.

    Boot, on enter: a cgroup2 directory `sdbox-NAME`, the launching shell moved into it,
    then `unshare` runs sdbox/inner.sh as PID 1 of new namespaces; that script builds
    the root and execs systemd. Enter returns once `systemctl is-system-running --wait`
    says `running`. Exit always tears down: SIGKILL of the box's PID 1 (the kernel then
    kills its whole PID namespace), then rmdir of the cgroup tree.

    The box also dies when the thread that entered it exits (PR_SET_PDEATHSIG, via
    `setpriv --pdeathsig` and `unshare --kill-child`), so a killed test run leaves
    only an empty cgroup, removed by the next box.
    """

    def __init__(
        self,
        name: str | None = None,
        binds: Sequence[str | Path] = (),
        files: Mapping[str, str] | None = None,
        wants: Sequence[str] = (),
        boot_timeout: float = BOOT_TIMEOUT,
        keep_tmp: bool = False,
    ) -> None:
        self.name = name or f"{os.getpid()}-{secrets.token_hex(3)}"
        if not _NAME.fullmatch(self.name):
            raise BoxError(f"bad box name {self.name!r} (letters, digits, '-'; at most 40)")
        self.binds = [_check_bind(p) for p in binds]
        self.files = {_check_file(k): v for k, v in (files or {}).items()}
        self.wants = list(wants)
        self.boot_timeout = boot_timeout
        self.keep_tmp = keep_tmp
        self.hostname = f"{PREFIX}{self.name}"
        self.state_dir = _state_dir(self.name)
        self.log_path = self.state_dir / "box.log"
        self.cgroup: Path | None = None
        self.pid = 0
        self.boot_seconds = 0.0
        self.teardown_seconds = 0.0
        self._unshare: subprocess.Popen[bytes] | None = None
        self._pidfd: int | None = None
        self._log: IO[bytes] | None = None
        self._made_state_dir = False

    # -- lifetime

    def __enter__(self) -> Box:
        if os.geteuid() != 0:
            raise BoxError("the box needs root (it mounts, unshares and makes cgroups)")
        for tool in ("unshare", "nsenter", "setpriv", "pivot_root"):
            if shutil.which(tool) is None:
                raise BoxError(f"{tool} not found (install util-linux)")
        if not os.access(SYSTEMD, os.X_OK):
            raise BoxError(f"{SYSTEMD} not found (install systemd)")
        cg_root = cgroup2_root()
        clean_stale_boxes(cg_root)
        start = time.monotonic()
        try:
            self._start(cg_root)
            self._wait_running(start + self.boot_timeout)
        except BaseException:
            self._teardown()
            raise
        self.boot_seconds = time.monotonic() - start
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._teardown()

    def _start(self, cg_root: Path) -> None:
        cgroup = cg_root / self.hostname
        try:
            cgroup.mkdir()
        except FileExistsError:
            raise BoxError(f"a box named {self.name} already exists ({cgroup})") from None
        self.cgroup = cgroup
        try:
            self.state_dir.mkdir(mode=0o700)
        except FileExistsError:
            raise BoxError(f"state directory {self.state_dir} already exists") from None
        self._made_state_dir = True
        (self.state_dir / "mnt").mkdir()
        files = {
            f"etc/systemd/system/{TARGET}": _target_unit(self.wants),
            "etc/hostname": self.hostname + "\n",
            "etc/hosts": hosts_file(self.hostname),
            **self.files,
        }
        for relpath, text in files.items():
            path = self.state_dir / "root" / relpath
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)

        argv = [
            # The shell moves itself into the box cgroup, so the cgroup namespace that
            # unshare makes is rooted there.
            *("sh", "-c", 'echo $$ >"$0" && exec "$@"', str(cgroup / "cgroup.procs")),
            *("setpriv", "--pdeathsig", "KILL"),
            *("unshare", "--mount", "--pid", "--cgroup", "--uts", "--ipc", "--fork"),
            *("--kill-child", "--propagation", "private"),
            *("sh", str(INNER), str(self.state_dir), self.hostname, *self.binds, "--"),
            *(SYSTEMD, f"systemd.unit={TARGET}", *(f"systemd.mask={u}" for u in MASKED)),
        ]
        self._log = open(self.log_path, "wb")  # closed in _teardown
        self._unshare = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={"PATH": CLEAN_PATH},
        )
        unshare = self._unshare
        try:
            self.pid = first_child(unshare.pid, lambda: unshare.poll() is None)
        except WaitError:
            raise self._boot_failed("unshare exited before starting the box") from None
        self._pidfd = os.pidfd_open(self.pid)

    def _wait_running(self, deadline: float) -> None:
        private = Path(f"/proc/{self.pid}/root/run/systemd/private")

        def done() -> bool:  # systemd has exec'd, and listens on its private socket
            return self._comm() == "systemd" and private.exists()

        def failed() -> str | None:
            assert self._unshare is not None
            status = self._unshare.poll()
            return None if status is None else f"the box exited during boot (status {status})"

        try:
            wait_until(done, deadline, failed)
        except WaitError as e:
            raise self._boot_failed(str(e)) from None
        try:
            state = self.run(
                ["systemctl", "is-system-running", "--wait"],
                cwd="/",
                capture_output=True,
                timeout=max(deadline - time.monotonic(), 1.0),
            ).stdout.strip()
        except subprocess.TimeoutExpired:
            state = "starting (timed out)"
        if state != "running":
            failed_units = self._inside(["systemctl", "--failed", "--no-legend", "--plain"])
            units = ", ".join(line.split()[0] for line in failed_units)
            journal = self._inside(["journalctl", "-b", "-p", "warning", "-n", "3", "-o", "cat"])
            raise self._boot_failed(f"systemd is {state}; failed units: {units or 'none'}", journal)

    def _inside(self, argv: list[str]) -> list[str]:
        """Output lines of a diagnostic command in the box ([] when it fails)."""
        try:
            out = self.run(argv, cwd="/", capture_output=True, timeout=10).stdout
        except (OSError, subprocess.SubprocessError):
            return []
        return [line for line in out.splitlines() if line.strip()]

    def _boot_failed(self, reason: str, journal: Sequence[str] = ()) -> BoxError:
        try:
            log = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            log = []
        tail = [line.strip() for line in [*log, *journal] if line.strip()][-6:]
        return BoxError(
            f"box {self.name} did not boot: {reason}; log: {' | '.join(tail) or '(empty)'}"
        )

    def _comm(self) -> str:
        try:
            return Path(f"/proc/{self.pid}/comm").read_text().strip()
        except OSError:
            return ""

    def _is_our_systemd(self) -> bool:
        """The recorded PID still is systemd, in this box's cgroup (never kill others)."""
        if self.cgroup is None or self._comm() != "systemd":
            return False
        rel = "/" + str(self.cgroup.relative_to(cgroup2_root()))
        try:
            lines = Path(f"/proc/{self.pid}/cgroup").read_text().splitlines()
        except OSError:
            return False
        return any(line == f"0::{rel}" or line.startswith(f"0::{rel}/") for line in lines)

    def _teardown(self) -> None:
        start = time.monotonic()
        with _signals_blocked():
            try:
                self._stop()
                if self.cgroup is not None:
                    _remove_cgroup_tree(self.cgroup, time.monotonic() + 10.0)
                    self.cgroup = None
            finally:
                if self._log is not None:
                    self._log.close()
                    self._log = None
                if self._made_state_dir and not self.keep_tmp:
                    _remove_state_dir(self.state_dir)
                    self._made_state_dir = False
        self.teardown_seconds = time.monotonic() - start

    def _stop(self) -> None:
        killed = False
        if self._pidfd is not None:
            if self._is_our_systemd():
                try:
                    signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)
                    killed = True
                except ProcessLookupError:
                    pass
                # The pidfd turns readable when the process has exited (pidfd_open(2)).
                select.select([self._pidfd], [], [], 10.0)
            os.close(self._pidfd)
            self._pidfd = None
        if self._unshare is not None:
            if not killed:
                # No systemd to kill (boot failed before the exec): unshare is our own
                # child, and --kill-child takes its child, the box's PID 1, with it.
                self._unshare.kill()
            try:
                self._unshare.wait(timeout=10.0)
            except subprocess.TimeoutExpired:
                self._unshare.kill()
                self._unshare.wait()
            self._unshare = None

    # -- running things inside

    def command(self, argv: Sequence[str], cwd: str | None = None) -> list[str]:
        """argv wrapped to run inside the box, in cwd (default: the current directory)."""
        if self._pidfd is None:  # torn down: self.pid may be another process by now
            raise BoxError(f"box {self.name} is not running")
        wd = os.path.abspath(cwd if cwd is not None else os.getcwd())
        # nsenter opens the --wd directory before entering the namespaces: a plain path
        # would be the host's directory (getcwd() fails inside, ENOENT, and relative
        # paths reach the host's files). Through the box's root it is the box's.
        wd = f"/proc/{self.pid}/root{wd}"
        return ["nsenter", "-t", str(self.pid), "-a", f"--wd={wd}", "--", *argv]

    def run(
        self, argv: Sequence[str], *, cwd: str | None = None, **kwargs: Any
    ) -> subprocess.CompletedProcess[str]:
        """subprocess.run of argv inside the box (text mode)."""
        kwargs.setdefault("text", True)
        return subprocess.run(self.command(argv, cwd), **kwargs)

    def popen(
        self, argv: Sequence[str], *, cwd: str | None = None, **kwargs: Any
    ) -> subprocess.Popen[str]:
        """subprocess.Popen of argv inside the box (text mode)."""
        kwargs.setdefault("text", True)
        return subprocess.Popen(self.command(argv, cwd), **kwargs)

    def inner_pid(self, popen: subprocess.Popen[Any], timeout: float = 10.0) -> int:
        """Host PID of the command nsenter started (it forks to enter the PID namespace).

        Waits until that child has exec'd the command (or is gone): before, it is a copy
        of nsenter, with nsenter's cmdline.
        """
        deadline = time.monotonic() + timeout
        try:
            pid = first_child(popen.pid, lambda: popen.poll() is None, timeout)
            forked = cmdline(popen.pid)
            wait_until(lambda: cmdline(pid) != forked, deadline, lambda: None)
        except WaitError as e:
            raise BoxError(f"no command started by nsenter {popen.pid}: {e}") from None
        return pid


class HostSystemd:
    """The same interface as Box, for a host whose PID 1 is systemd."""

    name = "host"
    pid = 1
    boot_seconds = 0.0

    def __enter__(self) -> HostSystemd:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        pass

    def command(self, argv: Sequence[str], cwd: str | None = None) -> list[str]:
        """argv itself: the host already runs systemd."""
        return list(argv)

    def run(
        self, argv: Sequence[str], *, cwd: str | None = None, **kwargs: Any
    ) -> subprocess.CompletedProcess[str]:
        """subprocess.run of argv (text mode)."""
        kwargs.setdefault("text", True)
        return subprocess.run(list(argv), cwd=cwd, **kwargs)

    def popen(
        self, argv: Sequence[str], *, cwd: str | None = None, **kwargs: Any
    ) -> subprocess.Popen[str]:
        """subprocess.Popen of argv (text mode)."""
        kwargs.setdefault("text", True)
        return subprocess.Popen(list(argv), cwd=cwd, **kwargs)

    def inner_pid(self, popen: subprocess.Popen[Any], timeout: float = 10.0) -> int:
        """popen's own PID: nothing sits in between."""
        return popen.pid
