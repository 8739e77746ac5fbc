"""A plain-Python rank for the VM lab's tests (no torch: Python is slow in the VM).

Every rank writes `<dir>/rank<N>.json` with what it found, then acts:
  --hog-rank R --hog-mb M   rank R touches M MiB, 10 MiB at a time (the OOM killer
                            should end it); the others wait to be stopped
  --spawn                   start a multiprocessing worker and a setsid'd daemon
                            (double fork); record each one's Cpus_allowed_list
  --burn-sec S --hold-mb M  hold M MiB touched and burn S seconds of CPU, then exit 0
  --open PATH...            try to open each device node; record errno or 0
  --sleep S                 then sleep S seconds (default 0) and exit 0
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import resource
import time


def allowed(pid: int | str) -> str:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("Cpus_allowed_list:"):
                return line.split()[1]
    return "?"


def worker(queue: multiprocessing.Queue[str]) -> None:
    queue.put(allowed("self"))
    time.sleep(3600)


def daemon(path: str) -> None:
    """Double fork and setsid: a daemon the rank does not wait for."""
    if os.fork():
        return
    os.setsid()
    if os.fork():
        os._exit(0)
    with open(path + ".tmp", "w") as f:
        json.dump({"pid": os.getpid(), "cpus": allowed("self")}, f)
    os.rename(path + ".tmp", path)
    time.sleep(3600)
    os._exit(0)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--dir", required=True)
    p.add_argument("--hog-rank", type=int, default=-1)
    p.add_argument("--hog-mb", type=int, default=0)
    p.add_argument("--spawn", action="store_true")
    p.add_argument("--burn-sec", type=float, default=0.0)
    p.add_argument("--hold-mb", type=int, default=0)
    p.add_argument("--open", nargs="*", default=[])
    p.add_argument("--sleep", type=float, default=0.0)
    args = p.parse_args()
    rank = int(os.environ["RANK"])
    out: dict[str, object] = {"pid": os.getpid(), "cpus": allowed("self")}
    out["nofile"] = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    with open("/proc/self/cgroup") as f:
        out["cgroup"] = f.read().strip()
    try:
        with open(f"/sys/fs/cgroup{out['cgroup'][3:]}/cpuset.cpus.effective") as f:
            out["cpuset"] = f.read().strip()
    except OSError:
        out["cpuset"] = None
    opened = {}
    for path in args.open:
        try:
            os.close(os.open(path, os.O_RDWR))
            opened[path] = 0
        except OSError as e:
            opened[path] = e.errno
    out["open"] = opened
    if args.spawn:
        queue: multiprocessing.Queue[str] = multiprocessing.Queue()
        proc = multiprocessing.Process(target=worker, args=(queue,), daemon=True)
        proc.start()
        out["worker"] = {"pid": proc.pid, "cpus": queue.get(timeout=300)}
        path = os.path.join(args.dir, f"rank{rank}.daemon.json")
        daemon(path)
        deadline = time.monotonic() + 300
        while not os.path.exists(path) and time.monotonic() < deadline:
            time.sleep(0.1)  # the daemon is ours to wait for before the rank ends
    held = []
    if args.hold_mb:
        block = bytearray(args.hold_mb << 20)
        block[::4096] = b"\x01" * len(block[::4096])
        held.append(block)
    with open(os.path.join(args.dir, f"rank{rank}.json.tmp"), "w") as f:
        json.dump(out, f)
    os.rename(
        os.path.join(args.dir, f"rank{rank}.json.tmp"), os.path.join(args.dir, f"rank{rank}.json")
    )
    print(f"rank {rank} ready", flush=True)
    if rank == args.hog_rank:
        while True:
            block = bytearray(10 << 20)
            block[::4096] = b"\x01" * len(block[::4096])
            held.append(block)
            if len(held) * 10 >= args.hog_mb:
                break
    elif args.hog_rank >= 0:
        time.sleep(3600)  # until stopped
    start = time.process_time()
    x = 0
    while time.process_time() - start < args.burn_sec:
        for _ in range(10_000):
            x += 1
    time.sleep(args.sleep)
    end = {"cpu_sec": time.process_time(), "maxrss": resource.getrusage(resource.RUSAGE_SELF)[2]}
    with open(os.path.join(args.dir, f"rank{rank}.end.json"), "w") as f:
        json.dump(end, f)  # what it used, by its own count (maxrss in KiB)
    del held


if __name__ == "__main__":
    main()
