"""A rank for the phases test (issue 36 item 4): it prints one line, then steps every
0.1 s (`step(n)`); rank 1 exits 3 after step 3 of attempt 0; the next attempt makes
--steps steps and waits --linger seconds (the test reads the metrics then). Torch-free.
It writes <dir>/truth<RANK>: JSON lines {attempt, event, t} (CLOCK_MONOTONIC, the
watcher's clock) for "line" (just after its first line) and "step" (its first step)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from gpulaunch.progress import step


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--dir", required=True)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--linger", type=float, default=0.0)
    args = p.parse_args()
    rank = int(os.environ["RANK"])
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    truth = open(os.path.join(args.dir, f"truth{rank}"), "a")  # noqa: SIM115 (for its life)

    def say(event: str) -> None:
        truth.write(json.dumps({"attempt": attempt, "event": event, "t": time.monotonic()}))
        truth.write("\n")
        truth.flush()

    print(f"rank {rank} attempt {attempt} up", flush=True)
    say("line")
    for n in range(1, args.steps + 1):
        time.sleep(0.1)
        if n == 1:
            say("step")
        step(n, total=args.steps)
        if attempt == 0 and rank == 1 and n == 3:
            sys.exit(3)
    time.sleep(args.linger)


if __name__ == "__main__":
    main()
