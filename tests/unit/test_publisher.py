"""The job's publisher (gpulaunch/jobapi/publisher.py) when its bus went away: the
reconnection's logic, with a stand-in bus that connects and then never answers."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest


def test_a_reconnection_cut_short_by_the_end_of_the_job_lets_go_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The soak's user-manager-stop and logout kinds (2 of 20): the job ended while the
    publisher reconnected to a bus whose daemon was gone; the cancelled reconnection waited
    up to 5 s for that bus's end, `finished` outlasted its 2 s and the watcher reported an
    internal error (TimeoutError) instead of the job's end."""
    from gpulaunch.jobapi import publisher as mod
    from gpulaunch.model import Manager
    from gpulaunch.parts import FINISH_TIMEOUT

    class SilentBus:  # connected, then nothing more: the daemon went away
        connected = True

        def __init__(self) -> None:
            self._disconnect_future = asyncio.get_running_loop().create_future()

        def add_message_handler(self, handler: object) -> None:
            pass

        async def request_name(self, name: str, flags: object) -> object:
            await asyncio.Event().wait()

        def disconnect(self) -> None:
            self.connected = False

        async def wait_for_disconnect(self) -> None:
            await asyncio.Event().wait()

    asked = asyncio.Event()

    async def connect(manager: Manager) -> SilentBus:
        asked.set()
        return SilentBus()

    monkeypatch.setattr(mod, "connect", connect)

    async def scenario() -> None:
        pub = mod.JobPublisher(warn=lambda text: None)
        job = SimpleNamespace(spec=SimpleNamespace(job="j", manager=Manager.USER))
        pub._job = job  # type: ignore[assignment]
        pub._watching = asyncio.get_running_loop().create_task(pub._publish_again())
        await asyncio.wait_for(asked.wait(), 5)
        await asyncio.sleep(0)  # it waits for the name now
        await asyncio.wait_for(pub.finished(job, None), FINISH_TIMEOUT)  # type: ignore[arg-type]

    asyncio.run(scenario())
