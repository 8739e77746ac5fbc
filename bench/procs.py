"""Looking at processes through /proc: a job's processes by token, a launcher's RSS and CPU.

Every process of a benchmark run carries the run's token, in its argv (the launcher and
the ranks get it as an argument) or in its environment (`BENCH_TOKEN`, inherited by
everything the launcher starts, helpers and grandchildren included). Scanning /proc for
it works the same for both launchers and needs nothing from them.

This is measurement code: it polls, at a fixed short interval, on purpose.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

TOKEN_VAR = "BENCH_TOKEN"
CLK_TCK = os.sysconf("SC_CLK_TCK")
PF_KTHREAD = 0x00200000  # include/linux/sched.h


def _read(path: str) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:  # gone, or a kernel thread's environ
        return None


def _state(pid: int) -> str | None:
    """The one-letter state of a process (proc(5)); None when it is gone."""
    stat = _read(f"/proc/{pid}/stat")
    if stat is None:
        return None
    return stat[stat.rindex(b")") + 2 :].split(b" ", 1)[0].decode()


class JobScanner:
    """Finds a job's processes again and again, cheaply: a process found foreign stays so.

    A process that carries no token now will not carry it later (the token comes with
    the environment a launcher gives its children), so its environment is read once.
    """

    def __init__(self, token: str, exclude: frozenset[int] = frozenset()) -> None:
        self.needle = token.encode()
        self.env_needle = f"{TOKEN_VAR}={token}".encode()
        self.foreign = {os.getpid(), *exclude}
        self.known: set[int] = set()  # found carrying the token: only their state is read

    def pids(self) -> list[int]:
        """Live (not zombie) processes carrying the token in their argv or environment."""
        found = []
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            pid = int(entry.name)
            if pid in self.foreign:
                continue
            if pid in self.known:
                if alive(pid):
                    found.append(pid)
                continue
            cmdline = _read(f"/proc/{pid}/cmdline")
            if cmdline is None:
                continue
            if self.needle not in cmdline:
                environ = _read(f"/proc/{pid}/environ")
                if environ is None or self.env_needle not in environ:
                    if cmdline or _kernel_thread(pid):  # empty, not a kernel thread: a zombie
                        self.foreign.add(pid)
                    continue
            if alive(pid):
                self.known.add(pid)
                found.append(pid)
        return found


def _kernel_thread(pid: int) -> bool:
    stat = _read(f"/proc/{pid}/stat")
    if stat is None:
        return False
    flags = int(stat[stat.rindex(b")") + 2 :].split()[6])  # field 9 of proc(5)
    return bool(flags & PF_KTHREAD)


def job_pids(token: str, exclude: frozenset[int] = frozenset()) -> list[int]:
    """Live (not zombie) processes carrying `token` in their argv or environment."""
    return JobScanner(token, exclude).pids()


def exec_count(token: str, script: str) -> int:
    """Processes that exec'd `python -u SCRIPT ... TOKEN`: ranks, not forks still at a gate."""
    needle, head = token.encode(), f"-u\0{script}\0".encode()
    count = 0
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            cmdline = _read(f"/proc/{entry.name}/cmdline")
            if cmdline and needle in cmdline and cmdline.split(b"\0", 1)[-1].startswith(head):
                count += 1
    return count


def wait_gone(
    token: str, cap: float, interval: float = 0.005, exclude: frozenset[int] = frozenset()
) -> float | None:
    """Wait until no process carries `token`; the time.time() it happened, None after `cap` s."""
    deadline = time.monotonic() + cap
    scanner = JobScanner(token, exclude)
    while True:
        now = time.time()
        if not scanner.pids():
            return now
        if time.monotonic() > deadline:
            return None
        time.sleep(interval)


def signal_token(token: str, signum: int) -> int:
    """Send `signum` to every process carrying `token` (a node frozen: SIGSTOP)."""
    pids = job_pids(token)
    for pid in pids:
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass
    return len(pids)


def kill_token(token: str, cap: float = 10.0) -> int:
    """SIGKILL every process carrying `token` (our own leftovers); returns how many there were."""
    pids = job_pids(token)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    if pids and wait_gone(token, cap) is None:
        raise RuntimeError(f"processes of {token} survive SIGKILL: {job_pids(token)}")
    return len(pids)


@dataclass(frozen=True)
class Usage:
    """One sample of a process's memory and CPU (proc(5): status VmHWM/VmRSS, stat utime+stime)."""

    at: float  # time.time() of the sample
    hwm_kib: int  # peak resident set size so far
    rss_kib: int
    cpu_s: float  # user + system CPU of the process itself (not of its children), in ticks
    threads_cpu_s: float  # the same from schedstat (ns) of its live threads: for short windows
    wakeups: int  # voluntary context switches of its live threads: how often it slept and woke


def usage(pid: int) -> Usage | None:
    """A sample of `pid`'s usage, or None when it is gone (or a zombie)."""
    at = time.time()
    status = _read(f"/proc/{pid}/status")
    stat = _read(f"/proc/{pid}/stat")
    if status is None or stat is None:
        return None
    fields: dict[str, int] = {}
    for line in status.decode().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmHWM", "VmRSS"):
            fields[key] = int(value.split()[0])
    if "VmHWM" not in fields:  # a zombie has no memory lines
        return None
    rest = stat[stat.rindex(b")") + 2 :].split()
    utime, stime = int(rest[11]), int(rest[12])  # fields 14 and 15 of proc(5)
    threads_ns, wakeups = _threads(pid)
    return Usage(
        at,
        fields["VmHWM"],
        fields["VmRSS"],
        (utime + stime) / CLK_TCK,
        threads_ns / 1e9,
        wakeups,
    )


def _threads(pid: int) -> tuple[int, int]:
    """CPU ns (schedstat, first field) and voluntary context switches, summed over threads."""
    ns = switches = 0
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return 0, 0
    for tid in tids:
        schedstat = _read(f"/proc/{pid}/task/{tid}/schedstat")
        status = _read(f"/proc/{pid}/task/{tid}/status")
        if schedstat is None or status is None:
            continue
        ns += int(schedstat.split()[0])
        for line in status.splitlines():
            if line.startswith(b"voluntary_ctxt_switches:"):
                switches += int(line.split()[1])
    return ns, switches


def pss_kib(pid: int) -> int | None:
    """Proportional set size: pages shared with other processes count in part (proc(5))."""
    rollup = _read(f"/proc/{pid}/smaps_rollup")
    if rollup is None:
        return None
    for line in rollup.splitlines():
        if line.startswith(b"Pss:"):
            return int(line.split()[1])
    return None


def cmdline(pid: int) -> bytes | None:
    return _read(f"/proc/{pid}/cmdline")


def pids_by_comm(*names: str) -> list[int]:
    """Processes whose comm is one of `names` (e.g. systemd's helpers in the box)."""
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            comm = _read(f"/proc/{entry.name}/comm")
            if comm is not None and comm.decode().strip() in names:
                found.append(int(entry.name))
    return found


def cpu_of(pids: list[int]) -> float:
    """Summed CPU seconds of the live processes among `pids`."""
    total = 0.0
    for pid in pids:
        sample = usage(pid)
        if sample is not None:
            total += sample.cpu_s
    return total


def read_stamps(directory: Path, prefix: str) -> dict[int, float]:
    """Stamps written by rank scripts (bench/ranks/stamp.py): the time.time() per rank."""
    return {rank: at for rank, (at, _) in read_stamps_pids(directory, prefix).items()}


def read_stamps_pids(directory: Path, prefix: str) -> dict[int, tuple[float, int]]:
    """Files `<prefix>.<rank>` holding `time.time() pid`, by rank."""
    stamps = {}
    for path in directory.glob(f"{prefix}.*"):
        suffix = path.name.rsplit(".", 1)[1]
        if suffix.isdigit():
            at, pid = path.read_text().split()
            stamps[int(suffix)] = (float(at), int(pid))
    return stamps


def alive(pid: int) -> bool:
    """The process exists and is not a zombie."""
    return _state(pid) not in (None, "Z", "X")
