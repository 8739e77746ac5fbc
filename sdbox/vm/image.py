"""The VM lab's base image: Debian 12 from Debian's packages, cached by its recipe's hash.

Built once per machine under /var/tmp/sdbox-vm/<hash>/ (shared by everyone on it;
a lock makes concurrent builds safe: the second waits, then uses the first's):

- `debootstrap --variant=minbase` of the packages below into a scratch directory;
- `configure.sh` run in that chroot (network, users alice and bob, SSH keys, the
  ready marker, a venv with gpulaunch's dependencies from a wheelhouse made here,
  a rootfs for containers);
- the kernel and initrd copied out, the tree turned into an ext4 image with
  `mkfs.ext4 -d` (no loop mount), and the directory renamed into place last.

The checkout is NOT in the image: each boot gets it on a second small disk
(sdbox/vm/machine.py), so editing code never needs a rebuild.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

SUITE = "bookworm"
MIRROR = os.environ.get("SDBOX_VM_MIRROR", "http://deb.debian.org/debian")
PACKAGES = (
    "systemd",
    "systemd-sysv",
    "dbus",
    "dbus-user-session",  # users' buses: what Debian desktops and most servers have
    "libpam-systemd",
    "udev",
    "kmod",
    "linux-image-cloud-amd64",
    "initramfs-tools",
    "openssh-server",
    "sudo",
    "iproute2",
    "procps",
    "psmisc",
    "util-linux",
    "python3",
    "python3-venv",
    "ca-certificates",
)
# Installed by apt-get in the chroot (configure.sh): podman's postinst fails under
# debootstrap's own package configuration.
APT_PACKAGES = ("podman", "uidmap")
# gpulaunch's runtime dependencies (pyproject.toml's [project] dependencies).
REQUIREMENTS = (
    "pystemd>=0.15.3",
    "jinja2>=3.1",
    "dbus-fast>=5.2",
    "setproctitle>=1.3",
    "psutil>=5.9",
    "rich>=13",
    "pytest>=8",  # the integration tests that need cgroup controllers run inside (tests/vm/)
)
IMAGE_SIZE = "4G"  # sparse: about 1.3 GB used
CONFIGURE = Path(__file__).with_name("configure.sh")
ROOT = Path(os.environ.get("SDBOX_VM_CACHE", "/var/tmp/sdbox-vm"))


class VMError(Exception):
    """A user-facing, one-line reason why the VM cannot be built or booted."""


@dataclass(frozen=True)
class Image:
    """A built base image: files in one cache directory."""

    dir: Path

    @property
    def disk(self) -> Path:
        return self.dir / "root.img"

    @property
    def kernel(self) -> Path:
        return self.dir / "vmlinuz"

    @property
    def initrd(self) -> Path:
        return self.dir / "initrd.img"

    @property
    def key(self) -> Path:
        """Private SSH key of root, alice and bob in this image."""
        return self.dir / "id_ed25519"


def recipe_hash() -> str:
    """Hash of everything that decides the image's content."""
    h = hashlib.sha256()
    for part in (
        SUITE,
        MIRROR,
        "\n".join(PACKAGES),
        "\n".join(APT_PACKAGES),
        "\n".join(REQUIREMENTS),
        IMAGE_SIZE,
    ):
        h.update(part.encode() + b"\0")
    h.update(CONFIGURE.read_bytes())
    return h.hexdigest()[:16]


def cached() -> Image | None:
    image = Image(ROOT / recipe_hash())
    return image if (image.dir / "done").exists() else None


def ensure(log: bool = True) -> Image:
    """The cached image, built first when missing (minutes); raises VMError."""
    image = cached()
    if image is not None:
        return image
    if os.geteuid() != 0:
        raise VMError("building the VM image needs root (debootstrap, chroot); run as root")
    for tool in ("debootstrap", "mkfs.ext4", "qemu-img", "ssh-keygen"):
        if shutil.which(tool) is None:
            raise VMError(f"{tool} not found: install it (bash scripts/setup.sh test)")
    ROOT.mkdir(parents=True, exist_ok=True)
    os.chmod(ROOT, 0o755)
    final = ROOT / recipe_hash()
    with open(ROOT / f"{final.name}.lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            _say(log, f"another build of this image runs; waiting for it ({lock.name})")
            fcntl.flock(lock, fcntl.LOCK_EX)
        if (final / "done").exists():  # someone else built it meanwhile
            return Image(final)
        for stale in ROOT.glob(f"{final.name}.build-*"):  # a build killed midway
            if stale.is_dir():
                _unmount_all(stale / "tree")
                shutil.rmtree(stale, ignore_errors=True)
            else:
                stale.unlink(missing_ok=True)
        started = time.monotonic()
        work = Path(tempfile.mkdtemp(prefix=f"{final.name}.build-", dir=ROOT))
        try:
            _build(work, log)
            shutil.rmtree(final, ignore_errors=True)
            (work / "done").write_text(f"built in {time.monotonic() - started:.0f} s\n")
            work.rename(final)
        finally:
            if work.exists():
                _unmount_all(work / "tree")
                shutil.rmtree(work, ignore_errors=True)
        if log:
            print(f"sdbox vm: image built in {time.monotonic() - started:.0f} s", file=sys.stderr)
        return Image(final)


def _say(log: bool, text: str) -> None:
    if log:
        print(f"sdbox vm: {text}", file=sys.stderr, flush=True)


def _run(cmd: list[str], what: str, log_file: Path, env: dict[str, str] | None = None) -> None:
    with open(log_file, "a") as out:
        out.write(f"$ {' '.join(cmd)}\n")
        out.flush()
        proc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, check=False, env=env)
    if proc.returncode != 0:
        raise VMError(f"{what} failed (exit {proc.returncode}); see {log_file}")


def _build(work: Path, log: bool) -> None:
    tree = work / "tree"
    build_log = ROOT / f"{work.name}.log"
    build_log.write_text("")
    _say(log, f"building the Debian {SUITE} image in {work} (log: {build_log})")
    _say(log, "debootstrap (about 2-3 minutes)")
    try:
        _run(
            ["debootstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}", SUITE,
             str(tree), MIRROR],
            "debootstrap", build_log,
        )  # fmt: skip
    except VMError:
        detail = tree / "debootstrap/debootstrap.log"
        if detail.exists():
            with open(build_log, "a") as out:
                out.write(detail.read_text()[-20000:])
        raise
    _say(log, "wheelhouse of gpulaunch's dependencies")
    wheels = tree / "tmp/wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    (tree / "tmp/requirements.txt").write_text("\n".join(REQUIREMENTS) + "\n")
    (tree / "tmp/apt-packages.txt").write_text(" ".join(APT_PACKAGES) + "\n")
    _run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--disable-pip-version-check",
         "-w", str(wheels), "-r", str(tree / "tmp/requirements.txt")],
        "pip wheel", build_log,
    )  # fmt: skip
    _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "sdbox-vm",
          "-f", str(work / "id_ed25519")], "ssh-keygen", build_log)  # fmt: skip
    shutil.copy(work / "id_ed25519.pub", tree / "tmp/vm-key.pub")
    shutil.copy(CONFIGURE, tree / "tmp/configure.sh")
    _say(log, "configuring the image (users, network, venv, container rootfs)")
    # The tree a mount point of its own: podman (configure.sh's import) makes its mounts
    # private from the root it sees, which must be one.
    _run(["mount", "--bind", str(tree), str(tree)], "mount the tree", build_log)
    for sub in ("proc", "dev"):
        _run(["mount", "--rbind" if sub == "dev" else "--bind", f"/{sub}", str(tree / sub)],
             f"mount {sub}", build_log)  # fmt: skip
    resolv = tree / "etc/resolv.conf"
    saved_resolv = os.readlink(resolv) if resolv.is_symlink() else None
    try:
        resolv.unlink(missing_ok=True)
        shutil.copy("/etc/resolv.conf", resolv)
        env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8", "HOME": "/root"}
        _run(["chroot", str(tree), "/bin/sh", "/tmp/configure.sh"], "configure.sh", build_log, env)
    finally:
        _unmount_all(tree)
    resolv.unlink(missing_ok=True)
    if saved_resolv is not None:
        os.symlink(saved_resolv, resolv)
    else:
        resolv.write_text("nameserver 10.0.2.3\n")
    shutil.rmtree(wheels, ignore_errors=True)
    for name in ("requirements.txt", "apt-packages.txt", "configure.sh"):
        (tree / "tmp" / name).unlink(missing_ok=True)
    boot = tree / "boot"
    kernels = sorted(boot.glob("vmlinuz-*"))
    initrds = sorted(boot.glob("initrd.img-*"))
    if not kernels or not initrds:
        raise VMError(f"no kernel or initrd in the image's /boot; see {build_log}")
    shutil.copy(kernels[-1], work / "vmlinuz")
    shutil.copy(initrds[-1], work / "initrd.img")
    _say(log, "mkfs.ext4 -d")
    _run(["mkfs.ext4", "-q", "-F", "-L", "sdbox-vm", "-d", str(tree), str(work / "root.img"),
          IMAGE_SIZE], "mkfs.ext4", build_log)  # fmt: skip
    shutil.rmtree(tree)


def _unmount_all(tree: Path) -> None:
    """Unmount everything mounted under tree, and the tree itself (deepest first)."""
    if not tree.exists():
        return
    top = str(tree.resolve())
    mounts = [
        line.split()[4]
        for line in Path("/proc/self/mountinfo").read_text().splitlines()
        if line.split()[4] == top or line.split()[4].startswith(top + "/")
    ]
    for mount in sorted(mounts, key=len, reverse=True):
        subprocess.run(["umount", "-l", mount], check=False, capture_output=True)
