"""A rank that writes its lines in phases, each after the test said go (no torch).

Phase P: print --lines numbered lines, create `<dir>/rank<R>.phase<P>`, then wait
for `<dir>/go<P>` (a test's signal) before the next phase.
"""

from __future__ import annotations

import argparse
import os
import time


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--dir", required=True)
    p.add_argument("--lines", type=int, default=10)
    p.add_argument("--phases", type=int, default=3)
    args = p.parse_args()
    rank = int(os.environ["RANK"])
    for phase in range(args.phases):
        for i in range(args.lines):
            print(f"rank {rank} phase {phase} line {i}", flush=True)
        open(os.path.join(args.dir, f"rank{rank}.phase{phase}"), "w").close()
        if phase + 1 < args.phases:
            go = os.path.join(args.dir, f"go{phase}")
            while not os.path.exists(go):  # a test script: polling is fine here
                time.sleep(0.01)


if __name__ == "__main__":
    main()
