"""Asking again a manager that exists but does not answer yet (gpulaunch/supervisor/reach.py)."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from gpulaunch.model import Manager
from gpulaunch.supervisor import reach


class NotYet(Exception):
    pass


def failing(times: int) -> tuple[list[float], Callable[[], str]]:
    calls: list[float] = []

    def attempt() -> str:
        calls.append(time.monotonic())
        if len(calls) <= times:
            raise NotYet
        return "answered"

    return calls, attempt


def test_a_transient_failure_is_asked_again() -> None:
    calls, attempt = failing(3)
    assert reach.retry(attempt, (NotYet,)) == "answered"
    assert len(calls) == 4
    assert all(b > a for a, b in zip(calls, calls[1:], strict=False))


def test_within_a_bounded_time() -> None:
    calls, attempt = failing(10**6)
    with pytest.raises(NotYet):
        reach.retry(attempt, (NotYet,), within=0.3)
    assert len(calls) < 20
    # Each wait was planned to end within the time (a loaded machine may oversleep each,
    # so the wall clock is not what is checked): the waits asked for, doubling from the
    # first up to the longest, add up to no more than `within`; each gap is at least its wait.
    waits = [min(reach._FIRST_S * 2**i, reach._MOST_S) for i in range(len(calls) - 1)]
    assert sum(waits) <= 0.3, waits
    gaps = [b - a for a, b in zip(calls, calls[1:], strict=False)]
    assert all(gap >= wait for gap, wait in zip(gaps, waits, strict=True)), (gaps, waits)


def test_never_where_no_manager_exists(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No socket: no manager is coming, so "no systemd" is said at once (one attempt)."""
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    monkeypatch.delenv("DBUS_SESSION_BUS_ADDRESS", raising=False)
    calls, attempt = failing(10**6)
    with pytest.raises(NotYet):
        reach.retry(attempt, (NotYet,), Manager.USER)
    assert len(calls) == 1
    assert not reach.manager_exists(Manager.USER)


def test_a_user_manager_exists_where_its_socket_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    monkeypatch.delenv("DBUS_SESSION_BUS_ADDRESS", raising=False)
    (tmp_path / "systemd").mkdir()
    with socket.socket(socket.AF_UNIX) as private:
        private.bind(str(tmp_path / "systemd" / "private"))
        assert reach.manager_exists(Manager.USER)
    (tmp_path / "systemd" / "private").unlink()
    (tmp_path / "bus").write_text("")  # a file is not a socket
    assert not reach.manager_exists(Manager.USER)
    monkeypatch.setenv("DBUS_SESSION_BUS_ADDRESS", f"unix:path={tmp_path}/other,guid=1")
    with socket.socket(socket.AF_UNIX) as bus:
        bus.bind(str(tmp_path / "other"))
        assert reach.manager_exists(Manager.USER)
