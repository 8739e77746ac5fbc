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
from gpulaunch.logs.feed import JournalLimit, JournalSpace, page_align
from gpulaunch.model import LogDrop, Manager
from gpulaunch.units.values import InvalidValue, parse_size, parse_timespan

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
    """The burst per unit and priority journald applies now (its configured one scaled by
    its free space, logs/feed.py `modulate`), or None when rate limiting is off."""
    return read_journal_limit(root).burst_now()


def journald_settings(root: Path = Path("/")) -> dict[str, str]:
    """journald.conf's [Journal] settings with its drop-ins applied (later wins)."""
    settings: dict[str, str] = {}
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
                settings[key] = value
    return settings


def rate_limit_settings(root: Path = Path("/")) -> tuple[int, str]:
    """journald's RateLimitBurst= and RateLimitIntervalSec= as configured (journald.conf(5))."""
    settings = journald_settings(root)
    burst = settings.get("RateLimitBurst", "")
    return int(burst) if burst.isdigit() else DEFAULT_BURST, settings.get(
        "RateLimitIntervalSec", "30s"
    )


def _size(settings: Mapping[str, str], key: str) -> int | None:
    """A configured size (SystemMaxUse= ...); None: unset or unreadable (journald's default)."""
    try:
        return parse_size(settings[key]) if settings.get(key) else None
    except InvalidValue:
        return None


def journal_space(root: Path = Path("/")) -> JournalSpace | None:
    """Where journald stores now and its size limits there, as it computes them; None: it
    stores nothing (Storage=none) or its directory is unknown.

    The system journal (/var/log/journal/ID) once journald has flushed to it
    (/run/systemd/journal/flushed), with Storage=auto or persistent; else the runtime
    journal (/run/log/journal/ID) (journald-server.c `determine_space`). The limits follow
    journal-file.c `journal_default_metrics` (systemd 252): SystemMaxUse=/RuntimeMaxUse=
    else 10 % of the file system within [1 MiB, 4 GiB]; the minimum use 2 % within
    [1 MiB, 16 MiB]; SystemKeepFree=/RuntimeKeepFree= else 5 %, at most 4 GiB; at least
    twice the file size limit. journald also raises the minimum to what its files used when
    it started (`patch_min_use`): unknown here, so the space is never overstated.
    """
    settings = journald_settings(root)
    storage = settings.get("Storage", "auto")
    if storage == "none":
        return None
    try:
        machine_id = (root / "etc/machine-id").read_text().strip()
    except OSError:
        return None
    if not machine_id:
        return None
    system = root / "var/log/journal" / machine_id
    flushed = (root / "run/systemd/journal/flushed").exists()
    persistent = storage in ("auto", "persistent") and flushed and system.is_dir()
    path = system if persistent else root / "run/log/journal" / machine_id
    kind = "System" if persistent else "Runtime"
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    fs_size = st.f_frsize * st.f_blocks
    max_use = _size(settings, f"{kind}MaxUse")
    if max_use is None:
        max_use = min(max(page_align(fs_size // 10), 1 << 20), 4 << 30)
    else:
        max_use = page_align(max_use)
        max_use = max(max_use, 1 << 20) if max_use else 0
    min_use = min(max(page_align(fs_size // 50), 1 << 20), 16 << 20)
    min_use = min(min_use, max_use)
    max_size = _size(settings, f"{kind}MaxFileSize")
    max_size = (
        min(page_align(max_use // 8), 128 << 20) if max_size is None else page_align(max_size)
    )
    if max_size:
        max_size = max(max_size, 512 << 10)
        if max_use and max_size * 2 > max_use:
            max_use = max_size * 2
    keep_free = _size(settings, f"{kind}KeepFree")
    if keep_free is None:
        keep_free = min(page_align(fs_size // 20), 4 << 30)
    return JournalSpace(str(path), max_use, min_use, keep_free)


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
    return JournalLimit(burst, seconds, journal_space(root))


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

    `ranks`: (unit, identifier) pairs; one journalctl for all of them (their ranks slice
    where they share one: a single match costs journalctl half the time of an OR of each
    unit's, 1.8 s instead of 3.3 s for 140,000 entries on a loaded machine), only entries
    since `since` (time.time()): an earlier job of the same id does not count.
    `writers`: where the ranks have no units (the direct supervisor), the pids of each
    identifier's log pumps, which wrote its streams (journald's `_PID`).
    """
    field = "_SYSTEMD_USER_UNIT" if manager is Manager.USER else "_SYSTEMD_UNIT"
    matches: list[str] = []
    within = _one_slice(ranks) if writers is None else None
    if within is not None:  # one match, not an OR of each rank's: half journalctl's time
        slice_field = "_SYSTEMD_USER_SLICE" if manager is Manager.USER else "_SYSTEMD_SLICE"
        matches = [f"{slice_field}={within}"]
    for unit, identifier in ranks if within is None else ():
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


def _one_slice(ranks: Sequence[tuple[str, str]]) -> str | None:
    """The ranks slice that holds every one of `ranks`' units (each `<stem>-rank<N>.scope`
    with identifier `rank<N>`), or None."""
    stems = {
        unit.removesuffix(f"-{identifier}.scope")
        for unit, identifier in ranks
        if unit.endswith(f"-{identifier}.scope")
    }
    if len(stems) != 1 or len(ranks) != sum(1 for u, i in ranks if u.endswith(f"-{i}.scope")):
        return None
    return f"{stems.pop()}-ranks.slice"


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
    pid: int = 0  # the writer's (the rank's log pump of one attempt): 0 unknown
    at: int = 0  # when journald received it (__REALTIME_TIMESTAMP, µs)


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
        pid=_number(entry.get("_PID")),
        at=_number(entry.get("__REALTIME_TIMESTAMP")),
    )


def _number(value: object) -> int:
    return int(value) if isinstance(value, str) and value.isdigit() else 0


STARTED = "MESSAGE_ID=39f53479d3a045ac8e11786248231fbf"  # systemd: a unit's start job is done


def attempt_starts(manager: Manager, job: str) -> list[int]:
    """When (µs since the epoch) each of the job's attempts after the first began: the
    first of its rank scopes' starts (systemd's "Started" entries: each restart starts every
    rank's scope again, after the attempt before has ended, its lines all stored); [] if
    journalctl cannot say (the direct supervisor makes no units)."""
    unit_opt = "--user-unit" if manager is Manager.USER else "--unit"
    argv = ["journalctl", "--no-pager", "-q", f"{unit_opt}={rank_units_pattern(job, None)}"]
    argv += ["-o", "json", "--output-fields=UNIT,USER_UNIT", STARTED]
    try:
        out = subprocess.run(argv, capture_output=True, check=False, timeout=120).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    per_unit: dict[str, list[int]] = {}
    for raw in out.splitlines():
        try:
            entry = json.loads(raw)
        except ValueError:
            continue
        unit = entry.get("UNIT") or entry.get("USER_UNIT")
        at = _number(entry.get("__REALTIME_TIMESTAMP"))
        if isinstance(unit, str) and at:
            per_unit.setdefault(unit, []).append(at)
    starts = [sorted(times) for times in per_unit.values()]
    deepest = max((len(times) for times in starts), default=0)
    return [min(times[k] for times in starts if len(times) > k) for k in range(1, deepest)]


def parse_entries(stream: Iterator[bytes]) -> Iterator[LogLine]:
    """Rank lines from `journalctl -o json` output; systemd's own messages are skipped."""
    for raw in stream:
        line = parse_entry(raw)
        if line is not None:
            yield line
