"""A rank for the GPU checks: CUDA through the driver's own library, torch only if asked.

Modes (`--mode`):
- `probe`: open each `--open` path and record the errno (0: opened), then initialise
  CUDA and allocate `--alloc-mib` MiB
  through libcuda (the driver API, no torch needed); record what happened; exit 0.
- `hold`: allocate through libcuda, write `rank<N>.ready`, then sleep until stopped;
  SIGUSR1 makes the rank fail (exit 3), as a crashing rank would.
- `allreduce`: torch with gloo on CUDA tensors (two ranks may share one GPU, which
  NCCL refuses); `--fail-rank R` raises on rank R after the first all-reduce while
  the others wait in the second.

Every rank writes `<dir>/rank<N>.pid` and `<dir>/rank<N>.json` (what it saw).
Also runs outside gpulaunch (`--outside`, no RANK in the environment): the baseline
the isolated rank's results are compared with.
"""

from __future__ import annotations

import argparse
import ctypes
import errno
import json
import os
import signal
import sys
import time
from typing import Any


def open_errno(path: str) -> int:
    """0 if `path` opens (read-only for nvidia-caps, as the rule allows), else the errno."""
    flags = os.O_RDONLY if "/nvidia-caps/" in path else os.O_RDWR
    try:
        os.close(os.open(path, flags))
    except OSError as exc:
        return exc.errno
    return 0


class Cuda:
    """The CUDA driver API (libcuda.so.1, installed with the driver) through ctypes."""

    def __init__(self) -> None:
        self.lib = ctypes.CDLL("libcuda.so.1")

    def _name(self, code: int) -> str:
        text = ctypes.c_char_p()
        self.lib.cuGetErrorName(code, ctypes.byref(text))
        return (text.value or b"?").decode()

    def check(self, code: int, what: str) -> None:
        if code != 0:
            raise RuntimeError(f"{what}: {self._name(code)} ({code})")

    def init(self) -> int:
        self.check(self.lib.cuInit(0), "cuInit")
        count = ctypes.c_int()
        self.check(self.lib.cuDeviceGetCount(ctypes.byref(count)), "cuDeviceGetCount")
        return count.value

    def bus_id(self, ordinal: int) -> str:
        dev = ctypes.c_int()
        self.check(self.lib.cuDeviceGet(ctypes.byref(dev), ordinal), "cuDeviceGet")
        buf = ctypes.create_string_buffer(64)
        self.check(self.lib.cuDeviceGetPCIBusId(buf, 64, dev), "cuDeviceGetPCIBusId")
        return buf.value.decode()

    def alloc(self, ordinal: int, mib: int) -> None:
        """A context on the device and `mib` MiB in it, kept until the process ends."""
        dev = ctypes.c_int()
        self.check(self.lib.cuDeviceGet(ctypes.byref(dev), ordinal), "cuDeviceGet")
        ctx = ctypes.c_void_p()
        self.check(
            self.lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain"
        )
        self.check(self.lib.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
        ptr = ctypes.c_uint64()
        self.check(
            self.lib.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(mib << 20)), "cuMemAlloc"
        )
        self.check(self.lib.cuMemsetD8_v2(ptr, 1, ctypes.c_size_t(mib << 20)), "cuMemsetD8")
        self.check(self.lib.cuCtxSynchronize(), "cuCtxSynchronize")


def cuda_report(mib: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    try:
        cuda = Cuda()
        out["device_count"] = cuda.init()
        out["bus_ids"] = [cuda.bus_id(i) for i in range(out["device_count"])]
        if mib:
            cuda.alloc(0, mib)
            out["allocated_mib"] = mib
        out["cuda_error"] = None
    except (OSError, RuntimeError) as exc:
        out["cuda_error"] = str(exc)
    return out


def allreduce(rank: int, fail_rank: int | None) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    device = torch.device("cuda", int(os.environ["LOCAL_RANK"]) % torch.cuda.device_count())
    torch.cuda.set_device(device)
    dist.init_process_group("gloo")
    world = dist.get_world_size()
    t = torch.full((1 << 20,), float(rank + 1), device=device)
    dist.all_reduce(t)
    torch.cuda.synchronize()
    expected = world * (world + 1) / 2
    got = float(t[0].item())
    if rank == fail_rank:
        raise RuntimeError(f"rank {rank} failed on purpose after an all-reduce on {device}")
    dist.all_reduce(t)  # the failing rank never joins: the others wait here until stopped
    dist.destroy_process_group()
    return {"device": str(device), "sum": got, "expected": expected, "torch": torch.__version__}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--dir", required=True)
    p.add_argument("--mode", choices=["probe", "hold", "allreduce"], required=True)
    p.add_argument("--open", default="", help="comma-separated device paths to open")
    p.add_argument("--alloc-mib", type=int, default=256)
    p.add_argument("--fail-rank", type=int, default=None)
    p.add_argument("--outside", action="store_true", help="not under gpulaunch: rank 'outside'")
    args = p.parse_args()
    name = "outside" if args.outside else f"rank{os.environ['RANK']}"

    def write(report: dict[str, Any]) -> None:
        tmp = os.path.join(args.dir, f"{name}.json.tmp")
        with open(tmp, "w") as f:
            json.dump(report, f)
        os.rename(tmp, os.path.join(args.dir, f"{name}.json"))

    with open(os.path.join(args.dir, f"{name}.pid"), "w") as f:
        f.write(str(os.getpid()))
    report: dict[str, Any] = {
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "pid": os.getpid(),
    }
    if args.mode == "probe":
        report["opened"] = {path: open_errno(path) for path in args.open.split(",") if path}
        report.update(cuda_report(args.alloc_mib))
        write(report)
        return
    if args.mode == "hold":

        def fail(signum: int, frame: object) -> None:
            print(f"{name} fails on purpose (got signal {signum})", file=sys.stderr, flush=True)
            os._exit(3)

        signal.signal(signal.SIGUSR1, fail)
        report.update(cuda_report(args.alloc_mib))
        write(report)
        if report["cuda_error"]:
            sys.exit(f"{name}: {report['cuda_error']}")
        open(os.path.join(args.dir, f"{name}.ready"), "w").close()
        while True:
            time.sleep(3600)  # until the test stops the job
    rank = int(os.environ["RANK"])
    report.update(allreduce(rank, args.fail_rank))
    write(report)


if __name__ == "__main__":
    try:
        main()
    except BrokenPipeError:
        sys.exit(errno.EPIPE)
