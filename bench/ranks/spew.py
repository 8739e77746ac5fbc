"""Scenario 5: write --lines numbered lines to stdout as fast as the reader takes them.

Whole lines only, in writes of at most PIPE_BUF bytes: pipe(7) makes such a write
atomic, so with either launcher no line is torn by another rank's write. A line:
`spew r=<rank> i=<7 digits> <32 x>.`
"""

import argparse
import os
import select

p = argparse.ArgumentParser()
p.add_argument("--lines", type=int, required=True)
p.add_argument("--token", required=True)
args = p.parse_args()
rank = int(os.environ["RANK"])
PAD = "x" * 32
per_write = select.PIPE_BUF // len(f"spew r={rank} i=0000000 {PAD}.\n")
for first in range(0, args.lines, per_write):
    last = min(first + per_write, args.lines)
    chunk = "".join(f"spew r={rank} i={i:07d} {PAD}.\n" for i in range(first, last)).encode()
    while chunk:
        chunk = chunk[os.write(1, chunk) :]
