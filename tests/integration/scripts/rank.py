"""A configurable rank for the integration tests (no torch: fast to start).

Every rank writes `<dir>/rank<N>.pid` (and the pids of any helpers it starts)
so a test can check that all of them are gone afterwards.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time


def rank_map(text: str) -> dict[int, int]:
    """`2:7,3:9` -> {2: 7, 3: 9}"""
    return {int(k): int(v) for k, v in (item.split(":") for item in text.split(",") if item)}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--dir", required=True, help="where to write pid files")
    p.add_argument("--sleep", type=float, default=0.0, help="seconds every rank sleeps")
    p.add_argument("--exit", type=rank_map, default={}, help="rank:code, after --fail-after")
    p.add_argument("--kill", type=rank_map, default={}, help="rank:signal to send to itself")
    p.add_argument("--fail-after", type=float, default=0.0)
    p.add_argument("--ignore-term", action="store_true", help="every rank ignores SIGTERM")
    p.add_argument("--grandchild", action="store_true", help="start a plain child: sleep")
    p.add_argument("--daemon", action="store_true", help="start a double-forked setsid daemon")
    p.add_argument("--worker", action="store_true", help="start a multiprocessing worker")
    p.add_argument("--zombie", action="store_true", help="a child that exits, never reaped")
    p.add_argument(
        "--orphan", action="store_true", help="a double-forked child that exits once adopted"
    )
    p.add_argument("--print", action="store_true", help="print env and cgroup")
    p.add_argument(
        "--on-usr1", action="store_true", help="on SIGUSR1 write rank<N>.usr1 (and its pid)"
    )
    p.add_argument("--until-usr1", type=int, default=0, help="exit 0 after N SIGUSR1s")
    p.add_argument("--spew", type=int, default=0, help="failing ranks: bytes to stderr, no newline")
    p.add_argument("--nofile", action="store_true", help="print RLIMIT_NOFILE: rank N soft hard")
    args = p.parse_args()
    rank = int(os.environ["RANK"])

    def record(name: str, pid: int) -> None:
        with open(os.path.join(args.dir, f"{name}.pid"), "w") as f:
            f.write(str(pid))

    record(f"rank{rank}", os.getpid())
    notices = []
    if args.on_usr1 or args.until_usr1:
        # A checkpoint on Slurm's warning: the rank goes on (and so does the job).
        def on_usr1(signum: int, frame: object) -> None:
            notices.append(signum)
            with open(os.path.join(args.dir, f"rank{rank}.usr1"), "a") as f:
                f.write(f"{os.getpid()}\n")

        signal.signal(signal.SIGUSR1, on_usr1)
    if args.ignore_term:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if args.grandchild:
        child = subprocess.Popen(["sleep", "300"])
        record(f"rank{rank}-child", child.pid)
    if args.worker:  # a dataloader's worker: a multiprocessing child that sleeps
        import multiprocessing

        worker = multiprocessing.get_context("fork").Process(target=time.sleep, args=(300,))
        worker.start()
        assert worker.pid is not None
        record(f"rank{rank}-worker", worker.pid)
    if args.daemon:
        # The classic double fork + setsid: escapes process-group based cleanup.
        # The middle process records the daemon's pid before it exits, and the rank waits
        # for it: the record exists before rank N.ready (the daemon writing it itself raced).
        if os.fork() == 0:
            os.setsid()
            daemon = os.fork()
            if daemon == 0:
                os.execvp("sleep", ["sleep", "300"])
            record(f"rank{rank}-daemon", daemon)
            os._exit(0)
        os.wait()
    if args.zombie:  # exits at once; the rank never waits for it: a zombie of the rank's
        child_pid = os.fork()
        if child_pid == 0:
            os._exit(0)
        record(f"rank{rank}-zombie", child_pid)
    if args.orphan:
        # The middle process records its child and exits (the rank reaps it); the child
        # reads its pipe to the middle until EOF (the middle is gone) and exits: a zombie
        # of whoever adopted it (the nearest subreaper), until that one reaps it.
        middle = os.fork()
        if middle == 0:
            r, w = os.pipe()
            orphan = os.fork()
            if orphan == 0:
                os.close(w)
                os.read(r, 1)
                os._exit(0)
            record(f"rank{rank}-orphan", orphan)
            os._exit(0)
        os.waitpid(middle, 0)  # that one only: the --zombie child stays unreaped
    if args.print:
        with open("/proc/self/cgroup") as f:
            cgroup = f.read().strip().splitlines()[-1]
        print(f"rank {rank} cgroup {cgroup}", flush=True)
    if args.nofile:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        print(f"rank {rank} nofile {soft} {hard}", flush=True)
    open(os.path.join(args.dir, f"rank{rank}.ready"), "w").close()
    if rank in args.exit or rank in args.kill:
        time.sleep(args.fail_after)
        if rank in args.kill:
            os.kill(os.getpid(), args.kill[rank])
        with open(os.path.join(args.dir, f"rank{rank}.failed"), "w") as f:
            f.write(repr(time.time()))
        for start in range(0, args.spew, 1 << 20):
            sys.stderr.write("y" * min(1 << 20, args.spew - start))
        sys.stderr.flush()
        sys.exit(args.exit[rank])
    while len(notices) < args.until_usr1:
        time.sleep(0.05)  # a test stand-in: pause() could miss a signal that came first
    time.sleep(args.sleep)


if __name__ == "__main__":
    main()
