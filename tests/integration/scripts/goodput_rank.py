"""A rank with scripted failures that records its own truth, for the goodput test (issue 39).

It steps every --step-seconds up to --steps, writes a checkpoint (<dir>/ckpt<RANK>) every
--every steps and then says so (`checkpoint(n)`), resumes after a restart from its own
checkpoint, and rank --fail-rank exits 3 after step --fail-step of attempt 0 (no
collectives: torch-free, fast to start). Everything it does goes, with its CLOCK_MONOTONIC
time (the watcher's clock), to <dir>/truth<RANK> as JSON lines {attempt, event, step, t}:
"step" and "checkpoint" just before it tells the watcher, "fail" just before it exits.
A SIGTERM (the gang stop) waits until a step's notice and its line are both out, so the
truth and what the watcher heard never differ by a step. After its last step a rank waits
for --linger seconds (in the box, the test reads the metrics then).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time

from gpulaunch.progress import checkpoint, step


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--dir", required=True)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--step-seconds", type=float, default=0.1)
    p.add_argument("--every", type=int, default=10)
    p.add_argument("--fail-rank", type=int, default=1)
    p.add_argument("--fail-step", type=int, default=32)
    p.add_argument("--linger", type=float, default=0.0)
    args = p.parse_args()
    rank = int(os.environ["RANK"])
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    truth = open(os.path.join(args.dir, f"truth{rank}"), "a")  # noqa: SIM115 (for its life)
    saved = os.path.join(args.dir, f"ckpt{rank}")

    def say(event: str, n: int) -> None:
        line = {"attempt": attempt, "event": event, "step": n, "t": time.monotonic()}
        truth.write(json.dumps(line) + "\n")
        truth.flush()

    start = int(open(saved).read()) + 1 if os.path.exists(saved) else 1  # noqa: SIM115
    term = {signal.SIGTERM}
    for n in range(start, args.steps + 1):
        time.sleep(args.step_seconds)
        signal.pthread_sigmask(signal.SIG_BLOCK, term)
        say("step", n)
        step(n, total=args.steps)
        if n % args.every == 0:
            with open(saved + ".tmp", "w") as f:
                f.write(str(n))
                f.flush()
                os.fsync(f.fileno())
            os.replace(saved + ".tmp", saved)
            say("checkpoint", n)
            checkpoint(n)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, term)  # a pending stop lands here
        if attempt == 0 and rank == args.fail_rank and n == args.fail_step:
            say("fail", n)
            sys.exit(3)
    time.sleep(args.linger)


if __name__ == "__main__":
    main()
