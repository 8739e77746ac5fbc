"""`--gpus auto:N`: N GPUs no other gpulaunch job on this machine holds, leased before the plan.

`take(opts)` finds the pool (CUDA_VISIBLE_DEVICES of this machine's GPUs), takes
the first N free GPUs of it in order (non-blocking flocks: store.py) and gives
back the options with `--gpus` set to their positions in the pool, so that the
plan places ranks on them as if the user had named them. Too few free GPUs: the
job is refused at once, naming every holder (holders.py), or, with
`--wait-for-gpus`, it waits for the first busy GPU to be freed (a blocking
flock: no polling) and tries again.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import sys
from dataclasses import replace
from typing import TYPE_CHECKING

from gpulaunch.errors import UnavailableError, UsageError
from gpulaunch.leases.holders import holders
from gpulaunch.leases.store import Lease, open_lock, store_fd, store_uid, try_lock
from gpulaunch.plan.gpus import Gpu, visible_pool
from gpulaunch.plan.leaserequest import LeaseRequest
from gpulaunch.plan.placement import Machine

if TYPE_CHECKING:
    from gpulaunch.plan.spec import StartOptions


class GpusBusyError(UnavailableError):
    """Fewer free GPUs than the job asks for (exit 69), naming who holds the others."""


def _pool(opts: StartOptions) -> tuple[Gpu, ...]:
    machine = Machine.fake(opts.machine_root) if opts.machine_root else Machine.this()
    return visible_pool(machine.inventory.gpus(), os.environ.get("CUDA_VISIBLE_DEVICES"))


def _positions(opts: StartOptions, pool: tuple[Gpu, ...], chosen: tuple[Gpu, ...]) -> StartOptions:
    gpus = tuple(pool.index(g) for g in chosen)
    nproc = opts.nproc if opts.nproc not in ("gpu", "auto") else len(gpus)
    return replace(opts, resources=replace(opts.resources, gpus=gpus), nproc=nproc)


def unleased(opts: StartOptions, request: LeaseRequest) -> StartOptions:
    """The options as `render` (and a front end's first plan) shows them: the pool's
    first N GPUs, nothing leased (the watcher leases when it starts)."""
    pool = _pool(opts)
    return _positions(opts, pool, pool[: request.count])


def take(
    opts: StartOptions, request: LeaseRequest, wait: bool = False
) -> tuple[StartOptions, Lease]:
    """The options with the leased GPUs as `--gpus`, and the lease (hold it for the job)."""
    pool = _pool(opts)
    if len(pool) < request.count:
        raise UsageError(
            f"--gpus {request}: this machine has {len(pool)} GPU(s)"
            + (
                " that CUDA_VISIBLE_DEVICES leaves visible"
                if "CUDA_VISIBLE_DEVICES" in os.environ
                else ""
            ),
            "ask for fewer",
        )
    root = opts.machine_root
    trusted = store_uid(root)
    announced = False
    with store_fd(root, pool) as store:
        while True:
            lease = Lease(())
            got: list[Gpu] = []
            busy: list[tuple[Gpu, int]] = []
            for gpu in pool:
                if len(got) == request.count:
                    break
                fd = open_lock(store, gpu, trusted)
                if fd is None:
                    lease.close()
                    raise GpusBusyError(
                        f"--gpus {request}: GPU {gpu.index} ({gpu.bus_id}) has no lock file "
                        "of root's in the lease store",
                        "run `sudo gpulaunch setup` (or a root job with --gpus auto:N) so that "
                        "root makes the lock files of this boot",
                    )
                if try_lock(fd):
                    lease.fds.append(fd)
                    got.append(gpu)
                else:
                    busy.append((gpu, fd))
            if len(got) == request.count:
                for _, fd in busy:
                    os.close(fd)
                return _positions(opts, pool, tuple(got)), replace(lease, gpus=tuple(got))
            lease.close()
            held = holders([g for g, _ in busy], root, busy=True)
            if not wait:
                for _, fd in busy:
                    os.close(fd)
                raise GpusBusyError(
                    f"--gpus {request}: only {len(got)} of {len(pool)} GPU(s) free; held by "
                    + "; ".join(h.describe() for h in held),
                    "wait for one of them to end, or start with --wait-for-gpus to queue",
                )
            if not announced:
                print(
                    f"gpulaunch: waiting for {request.count} free GPU(s) (--wait-for-gpus); "
                    "held by " + "; ".join(h.describe() for h in held),
                    file=sys.stderr,
                    flush=True,
                )
                announced = True
            try:
                wait_for_any([fd for _, fd in busy])  # woken when one of them is freed
            finally:
                for _, fd in busy:
                    os.close(fd)  # then every GPU is tried again, in order


def wait_for_any(fds: list[int]) -> None:
    """Block until the lock of one of `fds` can be taken (no polling).

    A blocking flock cannot wait on several files, nor be called off; so one child
    per fd blocks in it and exits when it got the lock (the lock stays with the open
    file, which we close to try again); we wait for the first child's pidfd, then
    SIGKILL and reap the others.
    """
    children: dict[int, int] = {}  # pidfd -> pid
    try:
        for fd in fds:
            pid = os.fork()
            if pid == 0:  # pragma: no cover - in the child
                try:
                    signal.signal(signal.SIGINT, signal.SIG_DFL)
                    try_lock(fd, block=True)
                finally:
                    os._exit(0)
            children[os.pidfd_open(pid)] = pid
        select.select(list(children), [], [])
    finally:
        for pidfd, pid in children.items():
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
            os.waitpid(pid, 0)
            os.close(pidfd)


def stand_in(opts: StartOptions) -> StartOptions:
    """`--gpus auto:N` before its lease: the pool's first N GPUs stand in (leases/request.py)."""
    if opts.gpu_lease is None or opts.resources.gpus is not None:
        return opts
    return unleased(opts, opts.gpu_lease)
