"""The GPU lease store: one lock file per GPU, flock(2)ed by the job that holds it.

Where: `/run/gpulaunch/gpus/nvidia<minor>`, named for the GPU's device node (a tmpfs:
a reboot frees every lease). The directory and its files are root's (0755 and 0644),
made by root (at boot by tmpfiles.d for minors 0-15 once `gpulaunch setup` installed
its entry; by root's first job asking for a lease for any other), so no ordinary user can replace
or remove a lock file another job has locked; anybody can open one read-only,
and flock(2) needs nothing more. An ordinary user therefore competes with root
and every other user for the same locks, but can neither take a GPU someone
holds nor make a lock of root's go away.

A lease is an open file description with an exclusive flock on it. The kernel
drops the lock when the last fd of it closes, and every process of the job has
one: the watcher that took it, under the direct supervisor its keeper (forked
after the lease was taken), and every rank (at fds 3, 4, ...: the job's GPU part hands
them to each rank it is forked with, part.py). So the lease lasts exactly as long as the last
process of the job: a SIGKILLed watcher's GPUs are free once systemd (BindsTo=)
or its keeper has stopped its ranks; a reboot empties /run. Nothing of ours has
to remember to release anything.

Everything is opened relative to the directory's fd, with O_NOFOLLOW, and
believed only if it is root's: root never follows a link an ordinary user planted,
and a user's job refuses a store someone other than root made.

Holders' notes (which job) are root's beside it in `/run/gpulaunch/holders` (0755) and a
user's in their own runtime directory: see notes.py. Nothing under /run/gpulaunch is
writable by others.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from gpulaunch.errors import UnavailableError

if TYPE_CHECKING:
    from gpulaunch.plan.gpus import Gpu

RUN_DIR = Path("/run/gpulaunch")


def lease_dir(root: Path | None = None) -> Path:
    """The store: /run/gpulaunch/gpus, or under a test's fake machine root."""
    return (root / "run/gpulaunch" if root is not None else RUN_DIR) / "gpus"


def lock_name(gpu: Gpu) -> str:
    """A GPU's lock file: its device node's name, stable while the driver is loaded."""
    return f"nvidia{gpu.minor}"


def _ours(st: os.stat_result, want_root: bool) -> bool:
    return st.st_uid == 0 or (not want_root and st.st_uid == os.geteuid())


def _store_problem(path: Path) -> UnavailableError:
    return UnavailableError(
        f"GPU leases need {path}, a directory of root's; it is missing or not root's",
        "run `sudo gpulaunch setup` once (or start a root job with --gpus auto:N) so that "
        "root makes it; /run is emptied at every boot",
    )


def open_store(root: Path | None = None, gpus: Sequence[Gpu] = ()) -> int:
    """An fd of the store; root makes it (and the lock files of `gpus`) where missing.

    Its parents are made by root too; only the store itself is checked: root's,
    not a link, not writable by others.
    """
    path = lease_dir(root)
    is_root = os.geteuid() == 0
    if is_root or root is not None:  # a test's fake machine: its tester makes it
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
        with contextlib.suppress(FileExistsError):
            os.mkdir(path, 0o755)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        raise _store_problem(path) from None
    st = os.fstat(fd)
    # root's, or (a test's fake machine root only) the tester's own
    if not (st.st_uid == 0 or (root is not None and st.st_uid == os.geteuid())) or (
        st.st_mode & 0o022
    ):
        os.close(fd)
        raise _store_problem(path)
    if is_root or (root is not None and st.st_uid == os.geteuid()):
        for gpu in gpus:
            with contextlib.suppress(FileExistsError):
                os.close(
                    os.open(
                        lock_name(gpu),
                        os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                        0o644,
                        dir_fd=fd,
                    )
                )
    return fd


def open_lock(store: int, gpu: Gpu, trusted_uid: int = 0) -> int | None:
    """A read-only fd of `gpu`'s lock file, or None where there is none (or not root's)."""
    try:
        fd = os.open(
            lock_name(gpu), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=store
        )
    except OSError:
        return None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_uid not in (0, trusted_uid):
        os.close(fd)
        return None
    return fd


def try_lock(fd: int, block: bool = False) -> bool:
    """flock(LOCK_EX) on `fd`: True if we hold it now (EINTR retried when not blocking)."""
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if block else fcntl.LOCK_NB))
            return True
        except BlockingIOError:
            return False
        except InterruptedError:
            if block:
                raise
        except OSError as exc:
            if exc.errno in (errno.EAGAIN, errno.EWOULDBLOCK):
                return False
            raise


@dataclass
class Lease:
    """GPUs held by this process (and its children forked after it): `close()` frees them."""

    gpus: tuple[Gpu, ...]
    fds: list[int] = field(default_factory=list)

    def close(self) -> None:
        for fd in self.fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self.fds.clear()


def store_uid(root: Path | None) -> int:
    """Whose lock files a job believes: root's, or in a test's fake root, the tester's too."""
    return os.geteuid() if root is not None else 0


@contextlib.contextmanager
def store_fd(root: Path | None, gpus: Sequence[Gpu]) -> Iterator[int]:
    fd = open_store(root, gpus)
    try:
        yield fd
    finally:
        os.close(fd)
