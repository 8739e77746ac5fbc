"""A rank that uses something measurable: it burns one CPU, or holds memory, or idles.

Prints one line, writes `<dir>/rank<N>.ready` and `<dir>/rank<N>.pid`, then for
`--seconds` it burns a CPU (`--burn-rank`), holds `--hold-mb` MiB it has touched
(`--hold-rank`), or sleeps; then exits 0. No torch: fast to start.
"""

from __future__ import annotations

import argparse
import os
import time


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--dir", required=True)
    p.add_argument("--burn-rank", type=int, default=-1)
    p.add_argument("--hold-rank", type=int, default=-1)
    p.add_argument("--hold-mb", type=int, default=300)
    p.add_argument("--seconds", type=float, default=300.0)
    args = p.parse_args()
    rank = int(os.environ["RANK"])
    held = None
    if rank == args.hold_rank:
        held = bytearray(args.hold_mb << 20)
        held[::4096] = b"\x01" * len(held[::4096])  # touch every page: resident
    print(f"rank {rank} ready", flush=True)
    with open(os.path.join(args.dir, f"rank{rank}.pid"), "w") as f:
        f.write(str(os.getpid()))
    open(os.path.join(args.dir, f"rank{rank}.ready"), "w").close()
    end = time.monotonic() + args.seconds
    if rank == args.burn_rank:
        x = 0
        while time.monotonic() < end:
            for _ in range(100_000):
                x += 1
    else:
        time.sleep(args.seconds)
    del held


if __name__ == "__main__":
    main()
