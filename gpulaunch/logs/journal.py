"""Reading the journal: journald's rate limit, the lines it kept of a rank, rank lines.

journald rate-limits per unit and a scope cannot change that
(docs/architecture.md): only journald.conf's `RateLimitBurst=`/`RateLimitIntervalSec=`
can. When a rank wrote more lines than the burst, the watcher compares what
the pump sent with what journald stored and reports the difference.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from gpulaunch.base.names import UnitNames
from gpulaunch.logs.feed import JournalLimit
from gpulaunch.model import LogDrop, Manager
from gpulaunch.units.values import InvalidValue, parse_timespan

DEFAULT_BURST = 10000  # journald.conf(5), systemd 252
CONF_DIRS = ("/usr/lib/systemd", "/usr/local/lib/systemd", "/run/systemd", "/etc/systemd")
__all__ = ["LogDrop", "rate_limit_burst", "stored_lines", "sync"]


def _conf_files(root: Path) -> list[Path]:
    """journald.conf, then its drop-ins in journald's order (later wins)."""
    main = root / "etc/systemd/journald.conf"
    drop_ins: dict[str, Path] = {}
    for d in CONF_DIRS:
        for f in sorted((root / d.lstrip("/") / "journald.conf.d").glob("*.conf")):
            drop_ins[f.name] = f  # a later directory overrides a file of the same name
    return [main, *(drop_ins[name] for name in sorted(drop_ins))]


def rate_limit_burst(root: Path = Path("/")) -> int | None:
    """journald's configured burst per unit, or None when rate limiting is off (read now)."""
    return read_journal_limit(root).burst


def rate_limit_settings(root: Path = Path("/")) -> tuple[int, str]:
    """journald's RateLimitBurst= and RateLimitIntervalSec= as configured (journald.conf(5))."""
    burst, interval = DEFAULT_BURST, "30s"
    for path in _conf_files(root):
        try:
            text = path.read_text()
        except OSError:
            continue
        section = ""
        for raw in text.splitlines():
            line = raw.strip()
            if line.startswith("["):
                section = line
            elif section == "[Journal]" and "=" in line and not line.startswith(("#", ";")):
                key, _, value = (part.strip() for part in line.partition("="))
                if key == "RateLimitBurst" and value.isdigit():
                    burst = int(value)
                elif key == "RateLimitIntervalSec":
                    interval = value
    return burst, interval


def read_journal_limit(root: Path = Path("/")) -> JournalLimit:
    """journald's rate limit as journald.conf and its drop-ins set it: a burst of 0 or an
    interval of 0 (in any unit) turns it off."""
    burst, interval = rate_limit_settings(root)
    try:
        seconds = parse_timespan(interval) / 1e6
    except InvalidValue:
        seconds = 30.0  # journald would refuse the value too and keep its default
    if burst == 0 or seconds == 0:
        return JournalLimit(None)
    return JournalLimit(burst, seconds)


@functools.cache
def journal_limit(root: Path = Path("/")) -> JournalLimit:
    """`read_journal_limit`, read once, for the pumps (logs/feed.py)."""
    return read_journal_limit(root)


def _journalctl(manager: Manager, args: Sequence[str]) -> list[str]:
    unit_flag = ["--user"] if manager is Manager.USER else []
    return ["journalctl", "--no-pager", "-q", *unit_flag, *args]


def sync(manager: Manager) -> None:
    """Have journald store everything it has received (journalctl --sync; root only)."""
    if manager is Manager.SYSTEM and os.geteuid() == 0:
        try:  # bounded: every job's end waits for it (a hung journald must not hang the job)
            subprocess.run(["journalctl", "--sync"], capture_output=True, check=False, timeout=30)
        except subprocess.TimeoutExpired:
            pass  # the count may then be short: reported as lines the journal lacks


def stored_lines(
    manager: Manager,
    ranks: Sequence[tuple[str, str]],
    since: float = 0.0,
    writers: Mapping[str, Sequence[int]] | None = None,
) -> dict[str, int] | None:
    """How many entries of each rank's streams the journal holds, by identifier; None:
    unknown (journalctl missing or hung).

    `ranks`: (unit, identifier) pairs; one journalctl for all of them (an OR of their
    matches), only entries since `since` (time.time()): an earlier job of the same id
    does not count. `writers`: where the ranks have no units (the direct supervisor),
    the pids of each identifier's log pumps, which wrote its streams (journald's `_PID`).
    """
    field = "_SYSTEMD_USER_UNIT" if manager is Manager.USER else "_SYSTEMD_UNIT"
    matches: list[str] = []
    for unit, identifier in ranks:
        whose = (
            [f"{field}={unit}"]
            if writers is None
            else [f"_PID={pid}" for pid in writers.get(identifier, ())] or ["_PID=0"]
        )
        matches += [*(["+"] if matches else []), *whose, f"SYSLOG_IDENTIFIER={identifier}"]
    after = [f"--since=@{since:.6f}"] if since else []
    try:
        out = subprocess.run(
            _journalctl(
                manager, ["-o", "cat", "--output-fields=SYSLOG_IDENTIFIER", *after, *matches]
            ),
            capture_output=True,
            check=False,
            timeout=120,
        ).stdout
    except (OSError, subprocess.TimeoutExpired):  # no journalctl, or it hangs: nothing known
        return None
    counts = dict.fromkeys((identifier for _, identifier in ranks), 0)
    for line in out.decode("utf-8", "replace").splitlines():
        if line in counts:
            counts[line] += 1
    return counts


def rank_units_pattern(job: str, rank: int | None) -> str:
    """A `journalctl -u` name (one rank) or glob (all of a job's ranks).

    journalctl matches globs without backslash escapes, and an escaped job id
    holds no glob characters (names.escape), so the name is used as it is.
    """
    names = UnitNames.for_job(job)
    if rank is not None:
        return names.rank_scope(rank)
    return names.rank_scope(0).removesuffix("0.scope") + "*.scope"


def logs_command(
    manager: Manager,
    job: str,
    rank: int | None = None,
    follow: bool = False,
    since: str | None = None,
    lines: int | None = None,
    after_cursor: str | None = None,
) -> list[str]:
    """The journalctl command behind `gpulaunch logs`.

    Only the ranks' own lines (`_TRANSPORT=stdout`: their pumps' streams), not
    systemd's messages about the units, so that `--lines` counts rank lines.
    Without `lines` it shows every line (`--follow` alone would show the last 10).
    """
    unit_opt = "--user-unit" if manager is Manager.USER else "--unit"
    args = [f"{unit_opt}={rank_units_pattern(job, rank)}", "--all", "-o", "json"]
    if follow:
        args.append("--follow")
    if since:
        args.append(f"--since={since}")
    if after_cursor is not None:
        args.append(f"--after-cursor={after_cursor}")
    else:
        args.append(f"--lines={lines if lines is not None else 'all'}")
    return ["journalctl", "--no-pager", "-q", *args, RANK_LINES]


RANK_LINES = "_TRANSPORT=stdout"  # a journalctl match: what came through a stream


@dataclass(frozen=True)
class LogLine:
    """One rank line read back from the journal."""

    rank: int
    stderr: bool
    message: bytes
    cursor: str = ""


def parse_entry(raw: bytes) -> LogLine | None:
    """A rank line from one line of `journalctl -o json`; None for anything else."""
    try:
        entry = json.loads(raw)
    except ValueError:
        return None
    ident = entry.get("SYSLOG_IDENTIFIER")
    if not isinstance(ident, str) or not ident.startswith("rank") or not ident[4:].isdigit():
        return None
    msg = entry.get("MESSAGE")
    data = bytes(msg) if isinstance(msg, list) else str(msg or "").encode()
    return LogLine(
        rank=int(ident[4:]),
        stderr=entry.get("PRIORITY") == "3",
        message=data,
        cursor=str(entry.get("__CURSOR", "")),
    )


def parse_entries(stream: Iterator[bytes]) -> Iterator[LogLine]:
    """Rank lines from `journalctl -o json` output; systemd's own messages are skipped."""
    for raw in stream:
        line = parse_entry(raw)
        if line is not None:
            yield line
