"""Reading the journal: journald's rate limit, lines it kept of a rank, and `gpulaunch logs`.

journald rate-limits per unit and a scope cannot change that
(systemd-facts.md): only journald.conf's `RateLimitBurst=`/`RateLimitIntervalSec=`
can. When a rank wrote more lines than the burst, the watcher compares what
the pump sent with what journald stored and reports the difference.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from gpulaunch.errors import UnknownJobError
from gpulaunch.model import LogDrop, Manager
from gpulaunch.units.names import UnitNames

DEFAULT_BURST = 10000  # journald.conf(5), systemd 252
CONF_DIRS = ("/usr/lib/systemd", "/usr/local/lib/systemd", "/run/systemd", "/etc/systemd")
__all__ = ["LogDrop", "cmd_logs", "rate_limit_burst", "stored_lines", "sync"]


def _conf_files(root: Path) -> list[Path]:
    """journald.conf, then its drop-ins in journald's order (later wins)."""
    main = root / "etc/systemd/journald.conf"
    drop_ins: dict[str, Path] = {}
    for d in CONF_DIRS:
        for f in sorted((root / d.lstrip("/") / "journald.conf.d").glob("*.conf")):
            drop_ins[f.name] = f  # a later directory overrides a file of the same name
    return [main, *(drop_ins[name] for name in sorted(drop_ins))]


def rate_limit_burst(root: Path = Path("/")) -> int | None:
    """journald's configured burst per unit, or None when rate limiting is off."""
    burst, interval = rate_limit_settings(root)
    if burst == 0 or interval.strip() in ("0", "0s", "0ms", "0us"):
        return None
    return burst


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


def _journalctl(manager: Manager, args: Sequence[str]) -> list[str]:
    unit_flag = ["--user"] if manager is Manager.USER else []
    return ["journalctl", "--no-pager", "-q", *unit_flag, *args]


def sync(manager: Manager) -> None:
    """Have journald store everything it has received (journalctl --sync; root only)."""
    if manager is Manager.SYSTEM and os.geteuid() == 0:
        subprocess.run(["journalctl", "--sync"], capture_output=True, check=False)


def stored_lines(manager: Manager, unit: str, identifier: str) -> int:
    """How many entries of a rank's streams the journal holds."""
    field = "_SYSTEMD_USER_UNIT" if manager is Manager.USER else "_SYSTEMD_UNIT"
    out = subprocess.run(
        _journalctl(
            manager,
            [
                "-o",
                "cat",
                "--output-fields=SYSLOG_IDENTIFIER",
                f"{field}={unit}",
                f"SYSLOG_IDENTIFIER={identifier}",
            ],
        ),
        capture_output=True,
        check=False,
    ).stdout
    return out.count(b"\n")


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
) -> list[str]:
    """The journalctl command behind `gpulaunch logs`."""
    unit_opt = "--user-unit" if manager is Manager.USER else "--unit"
    args = [f"{unit_opt}={rank_units_pattern(job, rank)}", "--all", "-o", "json"]
    if follow:
        args.append("--follow")
    if since:
        args.append(f"--since={since}")
    if lines is not None:
        args.append(f"--lines={lines}")
    return ["journalctl", "--no-pager", "-q", *args]


@dataclass(frozen=True)
class LogLine:
    """One rank line read back from the journal."""

    rank: int
    stderr: bool
    message: bytes


def parse_entries(stream: Iterator[bytes]) -> Iterator[LogLine]:
    """Rank lines from `journalctl -o json` output; systemd's own messages are skipped."""
    for raw in stream:
        try:
            entry = json.loads(raw)
        except ValueError:
            continue
        ident = entry.get("SYSLOG_IDENTIFIER")
        if not isinstance(ident, str) or not ident.startswith("rank") or not ident[4:].isdigit():
            continue
        msg = entry.get("MESSAGE")
        data = bytes(msg) if isinstance(msg, list) else str(msg or "").encode()
        yield LogLine(rank=int(ident[4:]), stderr=entry.get("PRIORITY") == "3", message=data)


def cmd_logs(args: argparse.Namespace) -> int:
    """`gpulaunch logs`: journalctl for the job's rank units, with rank prefixes."""
    manager: Manager = args.manager
    argv = logs_command(manager, args.job, args.rank, args.follow, args.since, args.lines)
    if not args.follow:
        probe = [*argv[:3], argv[3], "-o", "cat", "--lines=1"]
        if not subprocess.run(probe, capture_output=True, check=False).stdout:
            what = f"rank {args.rank} of job" if args.rank is not None else "job"
            raise UnknownJobError(
                f"no logs of {what} {args.job!r} in the journal",
                "check the job id (gpulaunch list --all), and --user/--system",
            )
    width = 1
    with subprocess.Popen(argv, stdout=subprocess.PIPE) as proc:
        assert proc.stdout is not None
        try:
            for line in parse_entries(iter(proc.stdout.readline, b"")):
                width = max(width, len(str(line.rank)))
                out = sys.stderr.buffer if line.stderr else sys.stdout.buffer
                out.write(f"[{line.rank:>{width}}] ".encode() + line.message + b"\n")
                out.flush()
        except BrokenPipeError:
            proc.terminate()
    return 0
