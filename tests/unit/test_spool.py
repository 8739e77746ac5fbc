"""A detached job's output without journald (gpulaunch/logs/spool.py, issue 35 item 5):
kept beside its record, bounded per rank, read back in order, cleaned with the record."""

from __future__ import annotations

import json
import os
from pathlib import Path

from gpulaunch.jobapi import filerecord
from gpulaunch.logs import spool


def jobs(tmp_path: Path) -> Path:
    return tmp_path / "gpulaunch" / "jobs"


def record(base: Path, job: str) -> None:
    base.mkdir(parents=True, exist_ok=True, mode=0o700)
    (base / filerecord.file_name(job)).write_text(json.dumps({}))


def test_lines_are_read_back_in_order_with_gpulaunch_own(tmp_path: Path) -> None:
    base = jobs(tmp_path)
    record(base, "j")
    s = spool.Spool("j", base)
    s.lines(0, False, [b"a0", b"b0"])
    s.lines(1, True, [b"a1"])
    s.message("gpulaunch: restarting")
    s.lines(0, False, [b"c0"])
    s.close()
    read = spool.read("j", base)
    assert read is not None and read.lost == {}
    got = [(x.rank, x.stderr, x.message) for x in read.lines]
    assert got == [
        (0, False, b"a0"),
        (0, False, b"b0"),
        (1, True, b"a1"),
        (None, False, b"gpulaunch: restarting"),
        (0, False, b"c0"),
    ]
    assert spool.read("other", base) is None


def test_a_rank_keeps_its_last_lines_and_says_what_it_lost(tmp_path: Path) -> None:
    base = jobs(tmp_path)
    record(base, "j")
    s = spool.Spool("j", base)
    line = b"x" * 1000
    n = 3 * spool.ROTATE_AT // 1000
    for i in range(n):
        s.lines(0, False, [b"%d " % i + line])
    s.close()
    read = spool.read("j", base)
    assert read is not None
    kept = [int(x.message.split()[0]) for x in read.lines]
    assert kept == list(range(kept[0], n))  # the last ones, in order
    size = sum(f.stat().st_size for f in (base / spool.spool_name("j")).iterdir())
    assert size <= 2 * spool.ROTATE_AT + 4096
    assert read.lost[0] > 0 and kept[0] > 0


def test_a_spool_goes_with_its_record(tmp_path: Path) -> None:
    base = jobs(tmp_path)
    record(base, "old")
    s = spool.Spool("old", base)
    s.lines(0, False, [b"x"])
    s.close()
    # a second job's spool: the first one's record is gone, so is its spool
    (base / filerecord.file_name("old")).unlink()
    record(base, "new")
    s = spool.Spool("new", base)
    s.lines(0, False, [b"y"])
    s.close()
    assert spool.read("old", base) is None
    assert not (base / spool.spool_name("old")).exists()
    # a record pruned by filerecord (the newest KEEP stay) takes its spool along
    with filerecord.directory(base) as fd:
        os.utime(base / filerecord.file_name("new"), (1, 1))
        for i in range(filerecord.KEEP):
            record(base, f"r{i}")
        filerecord._prune(fd)
    assert not (base / filerecord.file_name("new")).exists()
    assert not (base / spool.spool_name("new")).exists()


def test_a_new_job_of_the_same_id_starts_a_new_spool(tmp_path: Path) -> None:
    base = jobs(tmp_path)
    record(base, "j")
    for text in (b"first", b"second"):
        s = spool.Spool("j", base)
        s.lines(0, False, [text])
        s.close()
    read = spool.read("j", base)
    assert read is not None and [x.message for x in read.lines] == [b"second"]


def test_a_link_in_the_spool_place_is_not_followed(tmp_path: Path) -> None:
    base = jobs(tmp_path)
    record(base, "j")
    target = tmp_path / "elsewhere"
    target.mkdir()
    (base / spool.spool_name("j")).symlink_to(target)
    s = spool.Spool("j", base)
    s.lines(0, False, [b"x"])
    s.close()
    assert list(target.iterdir()) == []  # the link was removed, not written through
    read = spool.read("j", base)
    assert read is not None and [x.message for x in read.lines] == [b"x"]
