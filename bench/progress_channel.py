"""What the progress channel costs the watcher: the time to read and account one step.

    python -m bench.progress_channel [--datagrams N]

Runs the watcher's side (gpulaunch/progress/channel.py) on a real socket in this process,
8 ranks; this process's own steps stand for rank 0's main process (known by its pid) and,
in the second row, for a process of rank 0's found through /proc (its cgroup, then its
ancestry: what the direct supervisor's process groups need). Prints microseconds per
datagram (wall time of the read loop, median of 20 rounds) and what 8 ranks stepping
10 and 100 times a second would cost of one CPU.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

from gpulaunch import progress
from gpulaunch.base.names import UnitNames
from gpulaunch.base.procs import HeldChild
from gpulaunch.model import JobSpec, Manager, RankSpec, StepInfo
from gpulaunch.progress.channel import ProgressChannel

BURST = 8  # datagrams sent before each read (the socket's queue holds about 10)


@dataclass
class BenchRank:
    spec: RankSpec
    child: HeldChild | None
    cgroup: Path | None = None
    steps: StepInfo | None = None
    status_text: str | None = None


def spec(n: int) -> JobSpec:
    names = UnitNames.for_job("bench")
    ranks = tuple(RankSpec(i, i, names.rank_scope(i), ("true",), {}) for i in range(n))
    return JobSpec("bench", names, Manager.SYSTEM, ("true",), "/", n, n, "", 0, 1.0, ranks)


def per_datagram(channel: ProgressChannel, rounds: int, datagrams: int, first: int) -> float:
    """Median microseconds to read and account one datagram."""
    results, n = [], first
    for _ in range(rounds):
        spent = 0.0
        for _ in range(datagrams // BURST):
            for _ in range(BURST):
                n += 1
                progress.step(n, total=10**9)
            start = time.perf_counter()
            channel._on_readable()  # noqa: SLF001 (what the loop calls when it is readable)
            spent += time.perf_counter() - start
        results.append(spent / datagrams * 1e6)
    return statistics.median(results)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--datagrams", type=int, default=800)
    args = p.parse_args()
    me, other = os.getpid(), 1 << 22  # no such pid: the other ranks never send here
    ranks = [BenchRank(RankSpec(0, 0, "r0", (), {}), HeldChild(me, -1, None))] + [
        BenchRank(RankSpec(i, i, f"r{i}", (), {}), HeldChild(other + i, -1, None))
        for i in range(1, 8)
    ]
    channel = ProgressChannel(spec(8), lambda: ranks, journal=False)
    os.environ["NOTIFY_SOCKET"] = channel.environment()["NOTIFY_SOCKET"]
    try:
        main_pid = per_datagram(channel, 20, args.datagrams, 0)
        ranks[0].child = HeldChild(os.getppid(), -1, None)  # we are its descendant
        descendant = per_datagram(channel, 20, args.datagrams, 10**8)
    finally:
        channel.close()
    print("sender                    µs/datagram   8 ranks x 10/s   8 ranks x 100/s")
    for what, us in (("rank's main process", main_pid), ("a rank's descendant", descendant)):
        print(f"{what:<25} {us:>11.1f}   {us * 80 / 1e4:>12.3f} %   {us * 800 / 1e4:>13.3f} %")


if __name__ == "__main__":
    main()
