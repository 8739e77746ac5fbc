"""A booted VM of the lab: qemu over a throwaway overlay of the cached image.

Each boot starts pristine: a qcow2 overlay over the image (sdbox/vm/image.py), thrown
away at stop. The checkout comes in per boot on a second disk (`mkfs.ext4 -d` of its
tracked and untracked-but-not-ignored files, byte-compiled here at native speed), which
the guest mounts at /src; the image's venv finds gpulaunch there through a
.pth file. Root, alice and bob log in by key over real SSH on a free loopback port.

Ready is a line the guest writes on its serial console once
`systemctl is-system-running --wait` returns (after sshd): no polling of SSH.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

from sdbox.vm.image import ROOT, Image, VMError, ensure

READY = b"SDBOX-VM-READY"
BOOT_TIMEOUT = float(os.environ.get("SDBOX_VM_BOOT_TIMEOUT", "900"))
KVM_TRY_TIMEOUT = 40.0  # a KVM guest that boots is up in seconds; here it hangs
USERS = ("root", "alice", "bob")
SSH_OPTIONS = (
    "-o", "StrictHostKeyChecking=no",
    "-o", "UserKnownHostsFile=/dev/null",
    "-o", "LogLevel=ERROR",
    "-o", "BatchMode=yes",
    "-o", "ConnectTimeout=60",
    "-o", "ServerAliveInterval=30",
)  # fmt: skip


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _checkout_files(checkout: Path) -> list[str]:
    try:
        out = subprocess.run(
            ["git", "-C", str(checkout), "ls-files", "-z", "-co", "--exclude-standard"],
            capture_output=True, check=True,
        ).stdout  # fmt: skip
        return [f for f in out.decode().split("\0") if f]
    except (OSError, subprocess.CalledProcessError):
        skip = {".git", ".venv", ".it-tmp", "__pycache__"}
        return [
            str(p.relative_to(checkout))
            for p in checkout.rglob("*")
            if p.is_file() and not skip & set(p.relative_to(checkout).parts)
        ]


def make_checkout_disk(checkout: Path, dest: Path) -> None:
    """An ext4 image of the checkout (files as git sees them), byte-compiled."""
    staging = Path(tempfile.mkdtemp(prefix="src-", dir=dest.parent))
    try:
        size = 0
        for rel in _checkout_files(checkout):
            src = checkout / rel
            if not src.is_file() or src.is_symlink():
                continue
            target = staging / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, target)
            os.chmod(target, 0o755 if os.access(src, os.X_OK) else 0o644)
            size += src.stat().st_size
        for d in [staging, *(p for p in staging.rglob("*") if p.is_dir())]:
            os.chmod(d, 0o755)
        # Same Python minor (3.11) here and in the guest: its .pyc files are valid there.
        subprocess.run(
            ["python3", "-m", "compileall", "-q", "-j", "0", str(staging)],
            capture_output=True, check=False,
        )  # fmt: skip
        mib = max(64, 3 * size // (1 << 20) + 32)
        proc = subprocess.run(
            ["mkfs.ext4", "-q", "-F", "-L", "sdbox-src", "-d", str(staging), str(dest), f"{mib}M"],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        if proc.returncode != 0:
            raise VMError(f"mkfs.ext4 of the checkout failed: {proc.stderr.strip()}")
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _kvm_verdict_file() -> Path:
    return ROOT / "kvm-verdict"


def choose_accels() -> list[str]:
    """Accelerators to try in order: KVM first where it may work, TCG always last."""
    forced = os.environ.get("SDBOX_VM_ACCEL")
    if forced:
        return [forced]
    if not os.access("/dev/kvm", os.R_OK | os.W_OK):
        return ["tcg"]
    try:
        if _kvm_verdict_file().read_text().strip() == "hangs":
            return ["tcg"]
    except OSError:
        pass
    return ["kvm", "tcg"]


def clean_stale_runs(min_age: float = 3600.0) -> list[Path]:
    """Remove run directories of VMs whose qemu is gone (a test run killed with -9)."""
    removed = []
    for run in ROOT.glob("run-*"):
        try:
            pid = int((run / "qemu.pid").read_text())
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
            if str(run).encode() in cmd:
                continue  # its qemu still runs
        except (OSError, ValueError):
            try:
                if time.time() - run.stat().st_mtime < min_age and not (run / "qemu.pid").exists():
                    continue  # being set up right now
            except OSError:
                continue
        shutil.rmtree(run, ignore_errors=True)
        removed.append(run)
    return removed


class Machine:
    """One booted VM; a context manager (enter boots, exit stops and removes it all)."""

    def __init__(
        self,
        image: Image | None = None,
        checkout: Path | None = None,
        cpus: int = 2,
        memory_mib: int = 2048,
        log: bool = True,
    ) -> None:
        self.image = image
        self.checkout = checkout
        self.cpus = cpus
        self.memory_mib = memory_mib
        self.log = log
        self.port = 0
        self.accel = ""
        self.boot_seconds = 0.0
        self.state: Path | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._ready = threading.Event()  # the boot wait's wake-up: ready, or qemu gone
        self._saw_ready = False  # the guest wrote READY (not merely: qemu exited)
        self._tail: deque[str] = deque(maxlen=30)

    # -- lifecycle --------------------------------------------------------------

    def __enter__(self) -> Machine:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _say(self, text: str) -> None:
        if self.log:
            print(f"sdbox vm: {text}", file=sys.stderr, flush=True)

    @property
    def console_log(self) -> Path:
        assert self.state is not None
        return self.state / "console.log"

    def start(self) -> None:
        if self.image is None:
            self.image = ensure(log=self.log)
        ROOT.mkdir(parents=True, exist_ok=True)
        clean_stale_runs()
        self.state = Path(tempfile.mkdtemp(prefix="run-", dir=ROOT))
        overlay = self.state / "overlay.qcow2"
        subprocess.run(
            ["qemu-img", "create", "-q", "-f", "qcow2", "-F", "raw",
             "-b", str(self.image.disk), str(overlay)],
            check=True, capture_output=True,
        )  # fmt: skip
        src_disk = None
        if self.checkout is not None:
            src_disk = self.state / "src.img"
            make_checkout_disk(self.checkout, src_disk)
        started = time.monotonic()
        for accel in choose_accels():
            timeout = KVM_TRY_TIMEOUT if accel == "kvm" else BOOT_TIMEOUT
            if self._boot(accel, overlay, src_disk, timeout):
                if accel == "kvm":
                    _kvm_verdict_file().write_text("boots\n")
                self.accel = accel
                self.boot_seconds = time.monotonic() - started
                self._say(f"booted ({accel}) in {self.boot_seconds:.0f} s, ssh port {self.port}")
                return
            if accel == "kvm":
                _kvm_verdict_file().write_text("hangs\n")
                self._say("a KVM guest does not boot here; falling back to TCG (emulation)")
                # a fresh overlay: the hung guest may have written to the old one
                self._kill()
                overlay.unlink()
                subprocess.run(
                    ["qemu-img", "create", "-q", "-f", "qcow2", "-F", "raw",
                     "-b", str(self.image.disk), str(overlay)],
                    check=True, capture_output=True,
                )  # fmt: skip
        tail = "\n".join(self._tail)
        raise VMError(
            f"the VM did not boot (qemu exited, or no ready line within {BOOT_TIMEOUT:.0f} s;"
            f" console: {self.console_log});"
            f" last lines:\n{tail}"
        )

    def _boot(self, accel: str, overlay: Path, src_disk: Path | None, timeout: float) -> bool:
        assert self.image is not None and self.state is not None
        self.port = _free_port()
        cpu = ["-accel", "kvm", "-cpu", "host"] if accel == "kvm" else [
            "-accel", "tcg,thread=multi", "-cpu", "max"]  # fmt: skip
        cmd = [
            "qemu-system-x86_64", *cpu, "-smp", str(self.cpus), "-m", str(self.memory_mib),
            "-kernel", str(self.image.kernel), "-initrd", str(self.image.initrd),
            "-append", "console=ttyS0 root=/dev/vda rw quiet systemd.show_status=0",
            "-drive", f"file={overlay},format=qcow2,if=virtio,cache=unsafe",
            "-netdev", f"user,id=n0,hostfwd=tcp:127.0.0.1:{self.port}-:22",
            "-device", "virtio-net-pci,netdev=n0,romfile=",  # no iPXE ROM needed
            "-display", "none", "-serial", "stdio", "-monitor", "none", "-no-reboot",
        ]  # fmt: skip
        if src_disk is not None:
            cmd += ["-drive", f"file={src_disk},format=raw,if=virtio"]
        self._ready.clear()
        self._saw_ready = False
        self._proc = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            start_new_session=True,  # a terminal's ^C goes to us, we stop qemu
        )  # fmt: skip
        (self.state / "qemu.pid").write_text(f"{self._proc.pid}\n")
        reader = threading.Thread(target=self._read_console, args=(self._proc,), daemon=True)
        reader.start()
        self._ready.wait(timeout)
        # Not `_ready` alone: a qemu that fails at once (KVM: "failed to set MSR 0x10a")
        # closes its console and wakes the wait while poll() may not see it gone yet.
        return self._saw_ready and self._proc.poll() is None

    def _read_console(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdout is not None and self.state is not None
        with open(self.console_log, "ab") as log:
            for line in proc.stdout:
                log.write(line)
                log.flush()
                self._tail.append(line.decode(errors="replace").rstrip())
                if READY in line:  # after a getty prompt, maybe, on the same line
                    self._saw_ready = True
                    self._ready.set()
        self._ready.set()  # qemu exited: wake the boot wait (it checks poll())

    def _kill(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def stop(self) -> None:
        """Stop qemu and remove the overlay and the checkout disk (the console log too)."""
        if self.state is not None and self._proc is not None:
            for user in USERS:  # the shared logins' masters (they would see qemu go anyway)
                if (self.state / f"ssh-{user}").exists():
                    subprocess.run([*self.ssh_command(user), "-O", "exit"],
                                   capture_output=True, check=False, timeout=30)  # fmt: skip
        self._kill()
        if self.state is not None and os.environ.get("SDBOX_VM_KEEP") != "1":
            shutil.rmtree(self.state, ignore_errors=True)

    # -- using it ---------------------------------------------------------------

    def ssh_command(self, user: str = "root", tty: bool = False, fresh: bool = False) -> list[str]:
        """ssh argv for user. By default one login per user is kept open and later
        commands share it (ControlMaster): a login costs ~15 s in TCG (PAM, the user's
        manager), and shared commands run in that same session scope. fresh: a login
        of its own (its own session-N.scope; for logout tests)."""
        assert self.image is not None and self.state is not None
        if fresh:
            mux = ["-o", "ControlMaster=no", "-o", "ControlPath=none"]
        else:
            mux = ["-o", "ControlMaster=auto", "-o", f"ControlPath={self.state}/ssh-%r",
                   "-o", "ControlPersist=yes"]  # fmt: skip
        return [
            "ssh", *SSH_OPTIONS, *mux, "-i", str(self.image.key), "-p", str(self.port),
            *(["-t"] if tty else ["-T"]), f"{user}@127.0.0.1",
        ]  # fmt: skip

    def run(
        self,
        command: str | Sequence[str],
        user: str = "root",
        check: bool = False,
        timeout: float | None = 600,
        input: str | None = None,
        fresh: bool = False,
    ) -> subprocess.CompletedProcess[str]:
        """Run command (a shell line, or argv quoted for one) as user over SSH: a real
        login (pam_systemd session scope, PAM's limits); see ssh_command for fresh."""
        line = command if isinstance(command, str) else shlex.join(command)
        proc = subprocess.run(
            [*self.ssh_command(user, fresh=fresh), line],
            capture_output=True, text=True, timeout=timeout, input=input, check=False,
        )  # fmt: skip
        if check and proc.returncode != 0:
            raise VMError(
                f"as {user} in the VM: {line!r} exited {proc.returncode}:"
                f" {proc.stdout[-2000:]}{proc.stderr[-2000:]}"
            )
        return proc

    def popen(
        self, command: str | Sequence[str], user: str = "root", fresh: bool = False
    ) -> subprocess.Popen[str]:
        line = command if isinstance(command, str) else shlex.join(command)
        return subprocess.Popen(
            [*self.ssh_command(user, fresh=fresh), line],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
        )  # fmt: skip

    def put(self, local: Path, remote: str, user: str = "root", mode: int | None = None) -> None:
        """Copy a local file to remote (a path in the VM), owned by user."""
        data = local.read_text() if local.is_file() else None
        if data is None:
            raise VMError(f"{local} is not a file")
        self.write(remote, data, user=user, mode=mode)

    def copy(self, local: Path, remote: str, user: str = "root", timeout: float = 600) -> None:
        """Copy a local file, any bytes (a package, an archive), to remote in the VM, as user."""
        quoted = shlex.quote(remote)
        with open(local, "rb") as data:
            proc = subprocess.run(
                [*self.ssh_command(user), f"mkdir -p $(dirname {quoted}) && cat > {quoted}"],
                stdin=data, capture_output=True, timeout=timeout, check=False,
            )  # fmt: skip
        if proc.returncode != 0:
            raise VMError(f"copying {local} to {remote} in the VM failed: {proc.stderr!r}")

    def write(self, remote: str, text: str, user: str = "root", mode: int | None = None) -> None:
        """Write text to remote (a path in the VM) as user."""
        quoted = shlex.quote(remote)
        chmod = f" && chmod {mode:o} {quoted}" if mode is not None else ""
        self.run(
            f"mkdir -p $(dirname {quoted}) && cat > {quoted}{chmod}",
            user=user, check=True, input=text,
        )  # fmt: skip
