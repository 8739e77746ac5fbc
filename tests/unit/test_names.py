from __future__ import annotations

import itertools
import os
import random
import re

import pytest

from gpulaunch.base.names import HASHED_LENGTH, UnitNames, escape, validate_job_id


@pytest.mark.parametrize(
    ("job", "escaped"),
    [
        ("train", "train"),
        ("my-job", "my\\x2djob"),  # a dash would nest slices
        ("a/b", "a\\x2fb"),  # and must not collide with a-b
        ("a b", "a\\x20b"),
        (".hidden", "\\x2ehidden"),
        ("x.y_z:1", "x.y_z:1"),
        ("ü", "\\xc3\\xbc"),
        ("a\\b", "a\\x5cb"),
    ],
)
def test_escape(job: str, escaped: str) -> None:
    assert escape(job) == escaped


def test_no_collisions() -> None:
    jobs = ["a-b", "a/b", "a b", "a\\x2db", "a_b", "a.b"]
    assert len({escape(j) for j in jobs}) == len(jobs)


def test_long_names_are_hashed_and_fit() -> None:
    long_a = "ü" * 300
    long_b = "ü" * 299 + "x"
    names_a, names_b = UnitNames.for_job(long_a), UnitNames.for_job(long_b)
    assert names_a.job_slice != names_b.job_slice
    for name in (names_a.job_slice, names_a.watcher_scope, names_a.rank_scope(9_999_999)):
        assert len(name.encode()) <= 255
    # never cut in the middle of an escape sequence
    comp = names_a.component
    head = comp.rsplit("_", 1)[0]
    assert all(part.startswith("xc3") or part.startswith("xbc") for part in head.split("\\")[1:])


def _spelling_of_hashed(job: str) -> str:
    """A job id that, escaped byte by byte, spells `job`'s hashed form (as argv would give it)."""
    unescaped = re.sub(
        rb"\\x([0-9a-f]{2})", lambda m: bytes.fromhex(m[1].decode()), escape(job).encode()
    )
    return os.fsdecode(unescaped)


# Ids built to collide: issue 13 item 11's own example, hashed forms spelled out,
# lengths around the hashing threshold, escapes spelled literally, surrogates.
ADVERSARIAL = [
    "L" * 300,
    "L" * 210 + "_10bf7a12272b807e",  # the issue's: the old hashed form of "L" * 300
    _spelling_of_hashed("L" * 300),
    _spelling_of_hashed("ü" * 300),
    _spelling_of_hashed("\udcff" * 100),
    "L" * (HASHED_LENGTH - 1),
    "L" * HASHED_LENGTH,
    "L" * (HASHED_LENGTH + 1),
    "L" * (HASHED_LENGTH - 2) + "-",
    "L" * (HASHED_LENGTH - 5) + "-",
    "ü" * 300,
    "ü" * 299 + "x",
    "\\x2d",
    "-",
    "\\x2d" * 60,
    "-" * 60,
    "a-b",
    "a\\x2db",
    "ü",
    "\udcc3\udcbc",  # lone surrogates spelling the UTF-8 of "ü"
    "\udcff",  # the byte 0xff from argv (surrogateescape)
    "\udced\udcb3\udcbf",  # bytes ED B3 BF from argv: surrogatepass's encoding of U+DCFF
    "\ud800",  # a surrogate no bytes decode to
    ".x",
    "\\x2ex",
    "_" + "0" * 32,
    "x_" + "0" * (HASHED_LENGTH - 2),
]


def test_escaping_is_injective_on_adversarial_ids() -> None:
    jobs = set(ADVERSARIAL)
    assert len({escape(j) for j in jobs}) == len(jobs)


def test_escaping_is_injective_on_random_ids() -> None:
    # No hypothesis in the venv: a seeded search over ids built from the characters that
    # matter (escapes, "_", hex digits, multi-byte, surrogates), of lengths around the limit.
    rng = random.Random(13)
    alphabet = ["L", "_", "a", "0", "f", "x", "\\", "-", ".", "ü", "\udcff", "\udcc3", "€"]
    jobs = set(ADVERSARIAL)
    for _ in range(3000):
        n = rng.choice([1, 2, 3, 50, HASHED_LENGTH // 4, HASHED_LENGTH - 20, HASHED_LENGTH])
        jobs.add("".join(rng.choices(alphabet, k=rng.randint(1, n))))
    # and every id of up to 3 characters from that alphabet
    for k in range(1, 4):
        jobs.update("".join(p) for p in itertools.product(alphabet, repeat=k))
    names = {}
    for job in jobs:
        name = escape(job)
        assert names.setdefault(name, job) == job, (job, names[name])
    for name in names:
        assert len(name) <= HASHED_LENGTH


@pytest.mark.parametrize("job", ADVERSARIAL)
def test_every_id_gives_a_valid_unit_name(job: str) -> None:
    names = UnitNames.for_job(job)
    for name in (names.job_slice, names.watcher_scope, names.rank_scope(9_999_999)):
        assert len(name.encode()) <= 255
        assert all(c.isascii() and (c.isalnum() or c in ":-_.\\") for c in name)


def test_argv_bytes_get_their_systemd_escape() -> None:
    # An id from argv that is not UTF-8 is escaped byte by byte, as systemd-escape does.
    assert escape(os.fsdecode(b"a\xffb")) == "a\\xffb"


def test_unit_names() -> None:
    names = UnitNames.for_job("my-job")
    assert names.job_slice == "gpulaunch-my\\x2djob.slice"
    assert names.ranks_slice == "gpulaunch-my\\x2djob-ranks.slice"
    assert names.watcher_scope == "gpulaunch-my\\x2djob-watcher.scope"
    assert names.rank_scope(3) == "gpulaunch-my\\x2djob-rank3.scope"


@pytest.mark.parametrize(
    ("job", "ok"),
    [
        ("x", True),
        ("", False),
        ("a\nb", False),
        ("a b/ü-c", True),
        ("a\udcffb", False),  # invalid UTF-8 from argv
        ("\ud800", False),
    ],
)
def test_validate(job: str, ok: bool) -> None:
    assert (validate_job_id(job) is None) == ok
