from __future__ import annotations

import ctypes
import json
from pathlib import Path

from gpulaunch.base.names import UnitNames
from gpulaunch.logs.journal import logs_command, parse_entries, rank_units_pattern, rate_limit_burst
from gpulaunch.model import Manager


def conf(root: Path, rel: str, text: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_rate_limit_default_and_overrides(tmp_path: Path) -> None:
    assert rate_limit_burst(tmp_path) == 10000
    conf(tmp_path, "etc/systemd/journald.conf", "[Journal]\nRateLimitBurst=500\n")
    assert rate_limit_burst(tmp_path) == 500
    conf(tmp_path, "usr/lib/systemd/journald.conf.d/10-a.conf", "[Journal]\nRateLimitBurst=700\n")
    conf(tmp_path, "etc/systemd/journald.conf.d/60-b.conf", "[Journal]\n#RateLimitBurst=1\n")
    assert rate_limit_burst(tmp_path) == 700
    conf(tmp_path, "etc/systemd/journald.conf.d/70-c.conf", "[Journal]\nRateLimitIntervalSec=0\n")
    assert rate_limit_burst(tmp_path) is None


def test_the_packaged_drop_in_lifts_the_limit(tmp_path: Path) -> None:
    drop_in = Path(__file__).parents[2] / "packaging/journald/60-gpulaunch.conf"
    conf(tmp_path, "etc/systemd/journald.conf.d/60-gpulaunch.conf", drop_in.read_text())
    burst = rate_limit_burst(tmp_path)
    assert burst is not None and burst >= 10_000_000


_libc = ctypes.CDLL(None)


def fnmatch(name: str, pattern: str) -> bool:
    """glibc's fnmatch(3) with FNM_NOESCAPE, as journalctl matches -u globs."""
    return _libc.fnmatch(pattern.encode(), name.encode(), 2) == 0


def test_unit_pattern_matches_only_the_jobs_ranks() -> None:
    job = "my-job*[x]"
    pattern = rank_units_pattern(job, None)
    names = UnitNames.for_job(job)
    assert fnmatch(names.rank_scope(0), pattern)
    assert fnmatch(names.rank_scope(17), pattern)
    assert not fnmatch(names.watcher_scope, pattern)
    assert not fnmatch(UnitNames.for_job("my-job").rank_scope(0), pattern)
    assert rank_units_pattern(job, 3) == names.rank_scope(3)


def test_logs_command() -> None:
    argv = logs_command(Manager.USER, "j", rank=2, follow=True, since="-1h", lines=5)
    assert argv[:3] == ["journalctl", "--no-pager", "-q"]
    assert "--user-unit=gpulaunch-j-rank2.scope" in argv
    assert {"--follow", "--since=-1h", "--lines=5", "--all"} <= set(argv)


def test_parse_entries_skips_systemd_messages_and_decodes_binary() -> None:
    raw = [
        json.dumps({"SYSLOG_IDENTIFIER": "systemd", "MESSAGE": "Started x"}),
        json.dumps({"SYSLOG_IDENTIFIER": "rank1", "MESSAGE": "hi", "PRIORITY": "6"}),
        json.dumps({"SYSLOG_IDENTIFIER": "rank12", "MESSAGE": [255, 10], "PRIORITY": "3"}),
        "not json",
    ]
    lines = list(parse_entries(iter(r.encode() for r in raw)))
    assert [(x.rank, x.stderr, x.message) for x in lines] == [
        (1, False, b"hi"),
        (12, True, b"\xff\n"),
    ]


def test_logs_command_counts_rank_lines_and_shows_all_by_default() -> None:
    argv = logs_command(Manager.SYSTEM, "j", follow=True)
    assert argv[-1] == "_TRANSPORT=stdout"  # the ranks' streams, not systemd's messages
    assert "--lines=all" in argv  # journalctl --follow alone would show the last 10
    after = logs_command(Manager.SYSTEM, "j", lines=5, after_cursor="s=abc")
    assert "--after-cursor=s=abc" in after and not any(a.startswith("--lines") for a in after)
