"""A rank that fails with a slow teardown (2 s in an atexit handler), with or without @record.

Every rank writes `<dir>/rank<N>.pid`; the others write `<dir>/rank<N>.ready` once they
can record a SIGTERM, and `<dir>/rank<N>.term` (the wall-clock time) when it reaches them;
the failing rank writes `<dir>/rank<N>.exit` (the time) at the very end of its teardown.
With --catch it catches its exception (after @record wrote the error file) and exits 0.
With --victim-rank N, rank N plays a rank its partner's teardown took down: once the
failing rank's traceback is out (its teardown writes `<dir>/rank<N>.raised` first), it
says what gloo says then, "Connection closed by peer", and aborts as torch does.
"""

import argparse
import atexit
import os
import signal
import sys
import time

from torch.distributed.elastic.multiprocessing.errors import record


def stamp(directory: str, name: str) -> None:
    with open(os.path.join(directory, f"rank{os.environ['RANK']}.{name}"), "w") as f:
        f.write(repr(time.time()))


def train(args: argparse.Namespace) -> None:
    rank = int(os.environ["RANK"])
    if rank == args.fail_rank:
        # Fail once the others can record their SIGTERM (they may still import torch).
        others = [r for r in range(int(os.environ["WORLD_SIZE"])) if r != rank]
        while not all(os.path.exists(os.path.join(args.dir, f"rank{r}.ready")) for r in others):
            time.sleep(0.05)
        atexit.register(
            lambda: (stamp(args.dir, "raised"), time.sleep(2.0), stamp(args.dir, "exit"))
        )
        raise RuntimeError(f"rank {rank} fails on purpose")

    def on_term(signum: int, frame: object) -> None:
        stamp(args.dir, "term")
        os._exit(128 + signum)

    signal.signal(signal.SIGTERM, on_term)
    stamp(args.dir, "ready")
    if rank == args.victim_rank:
        raised = os.path.join(args.dir, f"rank{args.fail_rank}.raised")
        while not os.path.exists(raised):
            time.sleep(0.05)
        time.sleep(0.3)  # its traceback reached the watcher (a real peer takes that long too)
        print(f"[rank{rank}]: RuntimeError: [gloo/transport/tcp/pair.cc:553] Connection closed "
              "by peer [127.0.1.1]:5550. This is typically caused by a remote worker crashing.",
              file=sys.stderr, flush=True)  # fmt: skip
        print("terminate called without an active exception", file=sys.stderr, flush=True)
        os.abort()
    time.sleep(args.sleep)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--dir", required=True)
    p.add_argument("--fail-rank", type=int, default=1)
    p.add_argument("--no-record", action="store_true")
    p.add_argument("--catch", action="store_true", help="the failing rank catches it: exit 0")
    p.add_argument("--sleep", type=float, default=120.0, help="how long the others run")
    p.add_argument("--victim-rank", type=int, default=None, help="a rank taken down by it")
    args = p.parse_args()
    with open(os.path.join(args.dir, f"rank{os.environ['RANK']}.pid"), "w") as f:
        f.write(str(os.getpid()))
    try:
        (train if args.no_record else record(train))(args)
    except RuntimeError:
        if not args.catch:
            raise


if __name__ == "__main__":
    sys.exit(main())
