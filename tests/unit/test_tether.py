"""The watcher's watch on its front end (gpulaunch/frontend/tether.py), with real processes."""

from __future__ import annotations

import asyncio
import os
import subprocess

from gpulaunch.frontend.tether import FrontEndTether, identity
from gpulaunch.parts import Controls


def test_the_front_ends_end_stops_the_service() -> None:
    front_end = subprocess.Popen(["sleep", "60"])
    stops: list[str] = []
    tether = FrontEndTether(identity(front_end.pid), lambda: stops.append("stop"))
    loop = asyncio.new_event_loop()
    try:
        tether.attach(None, Controls(lambda: None), loop)  # type: ignore[arg-type]
        loop.run_until_complete(asyncio.sleep(0.05))
        assert stops == []  # alive: nothing to do
        front_end.kill()
        front_end.wait()

        async def until_stopped() -> None:
            while not stops:
                await asyncio.sleep(0.01)

        loop.run_until_complete(asyncio.wait_for(until_stopped(), 30))
        assert stops == ["stop"] and tether.pidfd == -1
    finally:
        loop.close()


def stopped_at_once(front_end: str) -> bool:
    stops: list[str] = []
    loop = asyncio.new_event_loop()
    try:
        tether = FrontEndTether(front_end, lambda: stops.append("stop"))
        tether.attach(None, Controls(lambda: None), loop)  # type: ignore[arg-type]
    finally:
        loop.close()
    return stops == ["stop"]


def test_a_front_end_gone_before_the_watcher_began() -> None:
    """Its pid may be someone else's by then: the start time tells."""
    gone = subprocess.Popen(["true"])
    gone.wait()
    for front_end in (identity(gone.pid), f"{os.getpid()}:1", "junk"):
        assert stopped_at_once(front_end), front_end


def test_its_identity_is_its_pid_and_start_time() -> None:
    pid, _, started = identity(os.getpid()).partition(":")
    assert int(pid) == os.getpid() and int(started) > 0
