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


def test_a_reconnection_whose_cancel_came_back_as_a_failure_gives_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The same kinds, the other way it went (a stack of the stuck task, 3 of 60): the cancel
    reached the bus library's connect, which made it a failure to connect (NoSystemdError);
    the reconnection slept and tried again, for ever, and `finished` timed out."""
    from gpulaunch.errors import GpulaunchError, NoSystemdError
    from gpulaunch.jobapi import publisher as mod
    from gpulaunch.model import Manager
    from gpulaunch.parts import FINISH_TIMEOUT

    asked = asyncio.Event()
    tries: list[int] = []

    async def connect(manager: Manager) -> object:
        tries.append(1)
        asked.set()
        if len(tries) > 1:  # (a try again ends the reconnection: this test cannot hang)
            raise GpulaunchError("a second try")
        try:
            await asyncio.Event().wait()  # the daemon does not answer
        except asyncio.CancelledError:
            raise NoSystemdError("cannot reach your systemd user manager") from None
        raise AssertionError("unreachable")

    monkeypatch.setattr(mod, "connect", connect)

    async def scenario() -> None:
        pub = mod.JobPublisher(warn=lambda text: None)
        job = SimpleNamespace(spec=SimpleNamespace(job="j", manager=Manager.USER))
        pub._job = job  # type: ignore[assignment]
        pub._watching = asyncio.get_running_loop().create_task(pub._publish_again())
        await asyncio.wait_for(asked.wait(), 5)
        await asyncio.wait_for(pub.finished(job, None), FINISH_TIMEOUT)  # type: ignore[arg-type]
        assert tries == [1], "it tried again after the end of the job"

    asyncio.run(scenario())
