from __future__ import annotations

import pytest

from gpulaunch.units.names import UnitNames, escape, validate_job_id


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


def test_unit_names() -> None:
    names = UnitNames.for_job("my-job")
    assert names.job_slice == "gpulaunch-my\\x2djob.slice"
    assert names.ranks_slice == "gpulaunch-my\\x2djob-ranks.slice"
    assert names.watcher_scope == "gpulaunch-my\\x2djob-watcher.scope"
    assert names.rank_scope(3) == "gpulaunch-my\\x2djob-rank3.scope"


@pytest.mark.parametrize(
    ("job", "ok"), [("x", True), ("", False), ("a\nb", False), ("a b/ü-c", True)]
)
def test_validate(job: str, ok: bool) -> None:
    assert (validate_job_id(job) is None) == ok
