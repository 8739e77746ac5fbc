"""A rank that writes output for the log tests (no torch: fast to start)."""

from __future__ import annotations

import argparse
import os
import sys
import time


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--dir", help="unused (the test helpers pass it to every script)")
    p.add_argument("--lines", type=int, default=3, help="numbered stdout lines")
    p.add_argument("--stderr", type=int, default=0, help="numbered stderr lines")
    p.add_argument("--blank", type=int, default=0, help="stdout lines of blanks only, or empty")
    p.add_argument("--long", type=int, default=0, help="one stdout line of this many bytes")
    p.add_argument("--no-newline", action="store_true", help="end stdout without a newline")
    p.add_argument("--progress", type=int, default=0, help="rank 0: a tqdm-like bar of N steps")
    p.add_argument("--delay", type=float, default=0.0, help="seconds between progress steps")
    p.add_argument("--crash", action="store_true", help="exit 3 right after the last line")
    p.add_argument("--binary", action="store_true", help="one line of non-UTF-8 bytes")
    args = p.parse_args()
    rank = int(os.environ["RANK"])
    out = sys.stdout.buffer
    for i in range(args.lines):
        out.write(b"rank %d line %d\n" % (rank, i))
    for i in range(args.blank):
        out.write((b"", b"  ", b"\t\r")[i % 3] + b"\n")
    for i in range(args.stderr):
        sys.stderr.buffer.write(b"rank %d err %d\n" % (rank, i))
    if args.long:
        out.write(b"L%d:" % rank + b"x" * (args.long - 4) + b"\n")
    if args.binary:
        out.write(b"bin \xff\xfe\xc3 rank %d\n" % rank)
    if args.progress and rank == 0:
        for i in range(args.progress + 1):
            sys.stderr.buffer.write(b"\rprogress %3d%%|%s|" % (100 * i // args.progress, b"#" * i))
            sys.stderr.buffer.flush()
            time.sleep(args.delay)
        sys.stderr.buffer.write(b"\n")
    if args.no_newline:
        out.write(b"rank %d tail without newline" % rank)
    out.flush()
    sys.stderr.flush()
    if args.crash:
        os._exit(3)


if __name__ == "__main__":
    main()
