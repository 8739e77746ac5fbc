"""The client side of the job API: talks to the watchers on one bus (docs/dbus.md).

Used by `gpulaunch list | status | stop | wait` (commands.py), which import it only
when they run: dbus-fast and asyncio cost ~0.1 s to import.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

from dbus_fast import Message, MessageType
from dbus_fast.aio import MessageBus

from gpulaunch.errors import AccessDeniedError, UsageError, WatcherCallError
from gpulaunch.jobapi.bus import ACCESS_DENIED, DBUS, DBUS_PATH, PROPERTIES, connect
from gpulaunch.jobapi.rankview import RankView, with_ends
from gpulaunch.jobapi.view import (
    INTERFACE,
    NAME_PREFIX,
    PATH_PREFIX,
    JobState,
    JobView,
    bus_name,
    bus_title,
    is_job_name,
    object_path,
)
from gpulaunch.model import Manager

T = TypeVar("T")
INVALID_ARGS = "org.freedesktop.DBus.Error.InvalidArgs"
_GONE = (
    "org.freedesktop.DBus.Error.ServiceUnknown",
    "org.freedesktop.DBus.Error.NameHasNoOwner",
    "org.freedesktop.DBus.Error.UnknownObject",
    "org.freedesktop.DBus.Error.NoReply",
)


class _Gone(Exception):
    """The job's watcher is not (or no longer) on the bus."""


class _Denied(Exception):
    """The bus or the watcher refused a call (AccessDenied); the text says why."""


class NotAJobError(WatcherCallError):
    """What answers at a job's name on the bus is not a gpulaunch job (exit 71)."""


def _dbus_call(
    destination: str, path: str, interface: str, member: str, signature: str = "", body: Any = ()
) -> Message:
    return Message(
        destination=destination,
        path=path,
        interface=interface,
        member=member,
        signature=signature,
        body=list(body),
    )


@dataclass(frozen=True)
class WaitResult:
    """What waiting for a job found: its final view, or that its watcher went away."""

    final: JobView | None
    running: bool  # its watcher was on the bus, and the job not over, when we looked


class JobClient:
    """Talks to the watchers of one bus."""

    def __init__(self, bus: MessageBus, manager: Manager) -> None:
        self.bus = bus
        self.manager = manager

    async def _call(self, msg: Message) -> Message:
        return self._checked(msg, await self.bus.call(msg))

    @staticmethod
    def _checked(msg: Message, reply: Message) -> Message:
        if reply.message_type is MessageType.ERROR:
            if reply.error_name in _GONE:
                raise _Gone(reply.error_name)
            if reply.error_name == ACCESS_DENIED:
                raise _Denied(_error_text(reply))
            raise WatcherCallError(f"{msg.member} failed: {reply.error_name}: {_error_text(reply)}")
        return reply

    async def _owner(self, name: str) -> str:
        reply = await self._call(_dbus_call(DBUS, DBUS_PATH, DBUS, "GetNameOwner", "s", [name]))
        return str(reply.body[0])

    async def get(self, name: str, path: str) -> JobView:
        """The job's live view; `_Gone` if its watcher is not on the bus, `NotAJobError` if
        what answers there is not a gpulaunch job (a user's own program may take the name on
        their session bus: what it says is parsed as untrusted input)."""
        reply = await self._call(_dbus_call(name, path, PROPERTIES, "GetAll", "s", [INTERFACE]))
        with self._parsing(name):
            return JobView.from_properties({k: v.value for k, v in reply.body[0].items()})

    @contextlib.contextmanager
    def _parsing(self, name: str) -> Iterator[None]:
        """What a job's object says, parsed: a value of the wrong shape is `NotAJobError`."""
        try:
            yield
        except (KeyError, ValueError, TypeError, IndexError, AttributeError) as exc:
            raise NotAJobError(
                f"{name} on {bus_title(self.manager)} is not a gpulaunch job "
                f"(its answer is not a job's: {type(exc).__name__} {exc})",
                "another program took a job's name on that bus; its owner can say which",
            ) from None

    async def find(self, job: str) -> JobView | None:
        try:
            return await self.get(bus_name(job), object_path(job))
        except _Gone:
            return None

    async def running(self) -> list[JobView]:
        reply = await self._call(_dbus_call(DBUS, DBUS_PATH, DBUS, "ListNames"))
        names = sorted(n for n in reply.body[0] if is_job_name(n))
        paths = [PATH_PREFIX + "/" + n[len(NAME_PREFIX) + 1 :] for n in names]
        found = await asyncio.gather(
            *(self.get(n, p) for n, p in zip(names, paths, strict=True)), return_exceptions=True
        )
        views = []
        for item in found:
            if isinstance(item, JobView):
                views.append(item)
            elif not isinstance(item, _Gone | NotAJobError):  # a job that ended meanwhile,
                raise item  # or a name that is not a job's: not listed
        return sorted(views, key=lambda v: v.job)

    async def wait(
        self, job: str, before_wait: Callable[[], Awaitable[None]] | None = None
    ) -> WaitResult:
        """Sleep until the job ends: its `Finished` signal, or its name going away.

        The match rules are in place before we look at the job, so no ending is
        missed; `before_wait` (Stop) runs once the job was seen on the bus.
        """
        name, path = bus_name(job), object_path(job)
        events: asyncio.Queue[Message] = asyncio.Queue()
        # How ranks ended beyond Finished's struct (core dumped, OOM kill): the watcher
        # announces every property (RankEnds too) just before Finished.
        ends: list[Any] = []

        def on_message(msg: Message) -> None:
            if msg.message_type is not MessageType.SIGNAL:
                return
            if (msg.member, msg.path) == ("PropertiesChanged", path) and msg.body[:1] == [
                INTERFACE
            ]:
                changed = msg.body[1].get("RankEnds")
                if changed is not None:
                    ends[:] = changed.value
                return
            if (msg.member, msg.interface, msg.path) == ("Finished", INTERFACE, path) or (
                msg.member == "NameOwnerChanged" and msg.sender == DBUS and msg.body[:1] == [name]
            ):
                events.put_nowait(msg)

        self.bus.add_message_handler(on_message)
        for rule in (
            f"type='signal',interface='{INTERFACE}',member='Finished',path='{path}'",
            f"type='signal',interface='{PROPERTIES}',member='PropertiesChanged',path='{path}'",
            f"type='signal',sender='{DBUS}',interface='{DBUS}',member='NameOwnerChanged',"
            f"arg0='{name}'",
        ):
            await self._call(_dbus_call(DBUS, DBUS_PATH, DBUS, "AddMatch", "s", [rule]))
        try:
            owner = await self._owner(name)
        except _Gone:
            return WaitResult(final=None, running=False)
        try:
            view = await self.get(name, path)
        except _Gone:  # it went away right now
            return WaitResult(final=None, running=True)
        if view.state.ended:
            return WaitResult(final=view, running=False)
        if before_wait is not None:
            try:
                await before_wait()
            except _Gone:
                pass  # it ended meanwhile: the signals say how
        while True:
            msg = await events.get()
            if msg.member == "Finished" and msg.sender == owner:
                with self._parsing(name):
                    state, status, cause, cause_rank, ranks = msg.body
                    final = dataclasses.replace(
                        view,
                        state=JobState(state),
                        status=int(status),
                        cause=str(cause),
                        cause_rank=int(cause_rank),
                        ranks=with_ends(tuple(RankView.from_wire(r) for r in ranks), ends),
                    )
                return WaitResult(final=final, running=True)
            if msg.member == "NameOwnerChanged" and msg.body[1] == owner:
                return WaitResult(final=None, running=True)

    async def stop_job(self, job: str, block: bool) -> WaitResult | None:
        """Stop the job; wait for its end if `block` (else None: the stop was accepted)."""
        if block:
            return await self.wait(job, before_wait=lambda: self.stop(job))
        try:
            await self.stop(job)
        except _Gone:
            return WaitResult(final=None, running=False)
        return None

    async def signal(self, job: str, signum: int, rank: int) -> int | None:
        """Signal(signum, rank) on the job's watcher: how many ranks got it; None: not running."""
        call = _dbus_call(
            bus_name(job), object_path(job), INTERFACE, "Signal", "ii", [signum, rank]
        )
        try:
            answer = await self.bus.call(call)
            if answer.message_type is MessageType.ERROR and answer.error_name == INVALID_ARGS:
                raise UsageError(f"cannot signal job {job!r}: {_error_text(answer)}")
            reply = self._checked(call, answer)
        except _Gone:
            return None
        except _Denied as exc:
            raise AccessDeniedError(
                f"not allowed to signal job {job!r}: {exc}",
                "only the user who started a job, or root, may signal it",
            ) from None
        with self._parsing(bus_name(job)):
            return int(reply.body[0])

    async def stop(self, job: str) -> None:
        """Ask the job's watcher to stop it; `_Gone` if it is not running."""
        try:
            await self._call(_dbus_call(bus_name(job), object_path(job), INTERFACE, "Stop"))
        except _Denied as exc:
            raise AccessDeniedError(
                f"not allowed to stop job {job!r}: {exc}",
                "only the user who started a job, or root, may stop it",
            ) from None


def _error_text(reply: Message) -> str:
    return str(reply.body[0]) if reply.body else ""


def run(manager: Manager, work: Callable[[JobClient], Awaitable[T]]) -> T:
    """Connect to the bus of `manager`'s jobs and run `work` with a client."""

    async def main() -> T:
        bus = await connect(manager)
        try:
            return await work(JobClient(bus, manager))
        except _Denied as exc:
            raise AccessDeniedError(
                f"{bus_title(manager)} refused access to gpulaunch's jobs: {exc}",
                "is gpulaunch's D-Bus policy installed? (sudo gpulaunch setup installs it)",
            ) from None
        finally:
            bus.disconnect()

    return asyncio.run(main())
