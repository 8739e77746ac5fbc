"""A rank that reports what it may use: CPUs, GPU variables, and which devices it can open.

Writes `<dir>/rank<N>.json` and `<dir>/rank<N>.ready`, then sleeps `--sleep` seconds
(so a test can look at its scope while it runs). No torch: fast to start.
"""

from __future__ import annotations

import argparse
import json
import os
import time


def try_open(path: str) -> int:
    """0 if `path` opens for reading and writing, else the errno."""
    try:
        os.close(os.open(path, os.O_RDWR | os.O_NOCTTY))
    except OSError as exc:
        return exc.errno or -1
    return 0


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--dir", required=True)
    p.add_argument("--open", default="", help="comma-separated device paths to try")
    p.add_argument("--sleep", type=float, default=0.0)
    args = p.parse_args()
    rank = os.environ["RANK"]
    shm = f"/dev/shm/gpulaunch-test-{os.getpid()}"
    with open(shm, "w") as f:  # /dev/shm is a file system: no device rule needed
        f.write("x")
    os.unlink(shm)
    report = {
        "rank": int(rank),
        "local_rank": os.environ["LOCAL_RANK"],
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "cuda_device_order": os.environ.get("CUDA_DEVICE_ORDER"),
        "affinity": sorted(os.sched_getaffinity(0)),
        "opened": {path: try_open(path) for path in args.open.split(",") if path},
    }
    with open(os.path.join(args.dir, f"rank{rank}.json"), "w") as f:
        json.dump(report, f)
    open(os.path.join(args.dir, f"rank{rank}.ready"), "w").close()
    time.sleep(args.sleep)


if __name__ == "__main__":
    main()
