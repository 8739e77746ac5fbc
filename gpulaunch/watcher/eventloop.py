"""The watcher's one event loop: asyncio's epoll loop, driven from synchronous code.

`_loop(until)` runs the loop until `until()` holds, re-checking after every
event; `_run(work)` runs a coroutine on it while every other event is handled
as usual; `_watch(fd, handler)` calls `handler` whenever `fd` is readable.
asyncio because the libraries that publish objects on D-Bus need it; no timer
and no poll interval of our own.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class EventLoop:
    """What every fd handler of the watcher goes through: their errors reach `_loop`."""

    def __init__(self) -> None:
        self._aio = asyncio.new_event_loop()
        self._changed: asyncio.Future[None] | None = None
        self._failure: BaseException | None = None  # raised by an fd handler: see _watch

    def _watch(self, fd: int, handler: Callable[[], None]) -> None:
        """Run `handler` whenever `fd` is readable; what it raises is raised by `_loop`."""

        def dispatch() -> None:
            try:
                handler()
            except BaseException as exc:  # asyncio would only log it: raise it from _loop
                if self._failure is None:
                    self._failure = exc
            self._poke()

        self._aio.add_reader(fd, dispatch)

    def _poke(self) -> None:
        if self._changed is not None and not self._changed.done():
            self._changed.set_result(None)

    def _loop(self, until: Callable[[], bool]) -> None:
        while True:
            if self._failure is not None:
                failure, self._failure = self._failure, None
                raise failure
            if until():
                return
            self._changed = self._aio.create_future()
            self._aio.run_until_complete(self._changed)

    def _run(self, work: Coroutine[Any, Any, T]) -> T:
        """Run `work` on the loop while every other event is handled as usual."""
        task = self._aio.create_task(work)
        task.add_done_callback(lambda _: self._poke())
        try:
            self._loop(task.done)
        finally:
            if not task.done():
                task.cancel()
        return task.result()
