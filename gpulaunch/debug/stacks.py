"""Where a rank is: its Python stacks (every thread), taken with py-spy.

py-spy (`pip install 'gpulaunch[debug]'`) reads another process's interpreter
through ptrace (process_vm_readv): it needs the same user as the rank (and a
`kernel.yama.ptrace_scope` that allows it) or root. `dump --json` gives every
thread's frames, innermost first; this module runs it for many pids at once
(asyncio subprocesses, so the watcher's loop goes on while they run) and turns
its output into typed stacks and text.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from gpulaunch.errors import AccessDeniedError, UnavailableError

DUMP_TIMEOUT = 20.0  # seconds for one py-spy dump (a rank with many threads, --native)
INSTALL_HINT = "install it with pip install 'gpulaunch[debug]' (or pip install py-spy)"


@dataclass(frozen=True)
class Frame:
    """One Python (or, with --native, C) frame."""

    name: str
    filename: str
    short: str  # the file's name as py-spy shortens it (package part only)
    line: int

    def describe(self) -> str:
        return f"{self.name} ({self.short}:{self.line})"


@dataclass(frozen=True)
class Thread:
    """One thread of a rank, its frames innermost first."""

    tid: int
    name: str
    active: bool
    frames: tuple[Frame, ...]


@dataclass(frozen=True)
class RankStacks:
    """A rank's stacks, or why they could not be had (`error`)."""

    rank: int
    unit: str
    pid: int
    threads: tuple[Thread, ...] = ()
    error: str | None = None
    denied: bool = False  # ptrace was refused (not a problem of this rank alone)

    def main_thread(self) -> Thread | None:
        """The thread whose id is the process's (the interpreter's main thread), else the first."""
        for thread in self.threads:
            if thread.tid == self.pid:
                return thread
        return self.threads[0] if self.threads else None


def find_pyspy() -> str:
    """The py-spy executable: next to this Python (its venv), else on PATH."""
    beside = Path(sys.executable).parent / "py-spy"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which("py-spy")
    if found is None:
        raise UnavailableError(
            "py-spy is not installed, and gpulaunch needs it for stacks", INSTALL_HINT
        )
    return found


def parse_dump(text: str) -> tuple[Thread, ...]:
    """py-spy dump --json: a list of threads (also, with --subprocesses, of other pids)."""
    threads = []
    for item in json.loads(text):
        frames = tuple(
            Frame(
                name=str(f.get("name") or "?"),
                filename=str(f.get("filename") or "?"),
                short=str(f.get("short_filename") or f.get("filename") or "?"),
                line=int(f.get("line") or 0),
            )
            for f in item.get("frames") or ()
        )
        threads.append(
            Thread(
                tid=int(item.get("os_thread_id") or item.get("thread_id") or 0),
                name=str(item.get("thread_name") or ""),
                active=bool(item.get("active")),
                frames=frames,
            )
        )
    return tuple(threads)


_DENIED = ("Permission denied", "Operation not permitted", "os error 1)", "os error 13)")


def _error_line(stderr: str) -> str:
    """py-spy's first error line, without its backtrace."""
    for line in stderr.splitlines():
        line = line.strip()
        if line and not line.startswith(("Stack backtrace", "Caused by")):
            return line.removeprefix("Error: ")
    return "py-spy failed without saying why"


async def dump_rank(pyspy: str, rank: int, unit: str, pid: int, native: bool = False) -> RankStacks:
    """One rank's stacks; a failure (it exited, ptrace denied) is in `error`, never raised."""
    argv = [pyspy, "dump", "--json", "--pid", str(pid)] + (["--native"] if native else [])
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), DUMP_TIMEOUT)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        return RankStacks(rank, unit, pid, error=f"py-spy took longer than {DUMP_TIMEOUT:g}s")
    stderr = err.decode(errors="replace")
    if proc.returncode != 0:
        denied = any(word in stderr for word in _DENIED)
        return RankStacks(rank, unit, pid, error=_error_line(stderr), denied=denied)
    try:
        return RankStacks(rank, unit, pid, threads=parse_dump(out.decode(errors="replace")))
    except (ValueError, TypeError, AttributeError) as exc:
        return RankStacks(rank, unit, pid, error=f"unreadable py-spy output: {exc}")


async def dump_ranks(
    pyspy: str, ranks: Sequence[tuple[int, str, int]], native: bool = False
) -> tuple[RankStacks, ...]:
    """The stacks of every (rank, unit, pid), taken at once (in parallel)."""
    return tuple(await asyncio.gather(*(dump_rank(pyspy, r, u, p, native) for r, u, p in ranks)))


def check_denied(stacks: Sequence[RankStacks]) -> None:
    """Raise the one-line error when ptrace was refused for every rank asked about."""
    if stacks and all(s.denied for s in stacks):
        raise AccessDeniedError(
            f"not allowed to read the ranks' stacks (ptrace): {stacks[0].error}",
            "run as the job's user or as root; kernel.yama.ptrace_scope must be 0 or 1 "
            "(or give py-spy CAP_SYS_PTRACE)",
        )


def format_stacks(stacks: RankStacks, limit: int | None = None) -> str:
    """`rank 2 (unit, pid 71)` and each thread's frames, innermost first.

    `limit` keeps at most that many frames per thread (the innermost ones).
    """
    head = f"rank {stacks.rank} ({stacks.unit}, pid {stacks.pid})"
    if stacks.error is not None:
        return f"{head}: no stacks: {stacks.error}"
    lines = [head + ":"]
    for thread in stacks.threads:
        state = "active" if thread.active else "idle"
        lines.append(f'  thread {thread.tid} ({state}): "{thread.name}"')
        frames = thread.frames if limit is None else thread.frames[:limit]
        lines += [f"    {frame.describe()}" for frame in frames]
        if len(frames) < len(thread.frames):
            lines.append(f"    [... {len(thread.frames) - len(frames)} outer frames cut ...]")
    return "\n".join(lines)
