"""A rank that saves a checkpoint when it is preempted (gpulaunch/recovery/preempt.py).

It sleeps until the signal its environment names (GPULAUNCH_PREEMPT_SIGNAL, else
SIGTERM) comes, then takes --save seconds to "save", writes <dir>/ckpt<RANK>.json and
exits 0. Requeued by Slurm (SLURM_RESTART_COUNT > 0) it writes <dir>/resumed<RANK> and
exits 0 at once. --exit N: exit N at once instead (no checkpoint); --succeed-from A: from
attempt A on (TORCHELASTIC_RESTART_COUNT), exit 0 at once. --exit-rank R: only rank R
exits --exit, once every other rank wrote its ready file. On the signal, before it saves,
a rank writes <dir>/term<RANK>.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time


class Preempted(Exception):
    pass


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--dir", required=True)
    p.add_argument("--save", type=float, default=6.0, help="seconds the checkpoint takes")
    p.add_argument("--sleep", type=float, default=300.0)
    p.add_argument("--exit", type=int, default=None)
    p.add_argument("--succeed-from", type=int, default=None)
    p.add_argument("--exit-rank", type=int, default=None)
    args = p.parse_args()
    rank = os.environ["RANK"]
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    with open(os.path.join(args.dir, "attempts"), "a") as f:
        f.write(f"{rank}:{attempt}\n")
    if args.succeed_from is not None and int(attempt) >= args.succeed_from:
        sys.exit(0)
    if args.exit is not None and args.exit_rank is None:
        sys.exit(args.exit)
    if args.exit is not None and args.exit_rank == int(rank):
        others = [r for r in range(int(os.environ["WORLD_SIZE"])) if r != int(rank)]
        while not all(os.path.exists(os.path.join(args.dir, f"ready{r}")) for r in others):
            time.sleep(0.05)
        sys.exit(args.exit)
    if os.environ.get("SLURM_RESTART_COUNT", "0") != "0":
        with open(os.path.join(args.dir, f"resumed{rank}"), "w") as f:
            f.write(os.environ["SLURM_RESTART_COUNT"])
        sys.exit(0)
    name = os.environ.get("GPULAUNCH_PREEMPT_SIGNAL", "SIGTERM")

    def preempted(signum: int, frame: object) -> None:
        signal.signal(signum, signal.SIG_IGN)  # one notice is enough: now save
        raise Preempted

    signal.signal(getattr(signal, name), preempted)
    with open(os.path.join(args.dir, f"ready{rank}"), "w") as f:
        f.write(str(os.getpid()))
    try:
        time.sleep(args.sleep)
    except Preempted:
        began = time.monotonic()
        with open(os.path.join(args.dir, f"term{rank}"), "w") as f:
            f.write(name)
        left = None
        deadline_file = os.environ.get("GPULAUNCH_PREEMPT_DEADLINE_FILE")
        if deadline_file and os.path.exists(deadline_file):  # written before a preemption's
            with open(deadline_file) as f:  # signal (not there for a gang stop's SIGTERM)
                left = float(f.read()) - time.time()
        time.sleep(args.save)  # writing the checkpoint
        record = {
            "signal": name,
            "grace": os.environ.get("GPULAUNCH_PREEMPT_GRACE"),
            "saved_in": time.monotonic() - began,
            "deadline_left": left,  # seconds from the signal to the deadline
        }
        with open(os.path.join(args.dir, f"ckpt{rank}.json"), "w") as f:
            json.dump(record, f)
    sys.exit(0)


if __name__ == "__main__":
    main()
