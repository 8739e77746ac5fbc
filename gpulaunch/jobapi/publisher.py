"""The job on the bus: its watcher publishes it while it runs (docs/dbus.md).

`JobPublisher` is a job `Part` (gpulaunch/parts.py). Before anything starts it connects to
the bus the job runs under (the system bus for the system manager, the user's
session bus for a user manager) and owns `io.gpulaunch.job.<label>`; then it
serves one object, `/io/gpulaunch/job/<label>`, with interface
`io.gpulaunch.Job1`, sends `PropertiesChanged` as the job changes, a
`RankExited` signal per rank and `Finished` at the end, and disconnects.

The object is served by one message handler rather than dbus-fast's
`ServiceInterface`: its introspection data is the XML shipped in
`packaging/dbus/` (one source of truth), and `Stop` needs the caller's
credentials, which `ServiceInterface` methods never see.

The bus may go away under a running job (`systemctl restart dbus`); the job
does not need it. The publisher says so once and connects again at once:
with socket activation (dbus.socket) the listening socket outlives the
daemon, so the connect succeeds and the authentication waits for the new
daemon, no timer involved. Only where the connect is refused (the daemon
stopped, no socket unit) does it retry on a back-off timer, which runs only
while disconnected (the bus address may be any address, so there is no path
to watch). Once connected it owns the name and serves the object again.
"""

from __future__ import annotations

import asyncio
import os
import shlex
import signal
import sys
from collections.abc import Callable, Coroutine
from dataclasses import replace
from typing import Any

from dbus_fast import (
    DBusError,
    Message,
    MessageFlag,
    MessageType,
    NameFlag,
    RequestNameReply,
    Variant,
)
from dbus_fast.aio import MessageBus

from gpulaunch.errors import (
    AccessDeniedError,
    GpulaunchError,
    JobExistsError,
    NoSystemdError,
)
from gpulaunch.jobapi.bus import (
    ACCESS_DENIED,
    CONNECT_TIMEOUT,
    DBUS,
    DBUS_PATH,
    INTROSPECTABLE,
    PROPERTIES,
    connect,
    forget,
    send,
)
from gpulaunch.jobapi.interface import (
    FINISHED_SIGNATURE,
    RANK_EXITED_SIGNATURE,
    STANDARD_INTERFACES,
    UNANNOUNCED,
    interface_xml,
)
from gpulaunch.jobapi.rankview import RankView
from gpulaunch.jobapi.view import INTERFACE, JobView, bus_name, bus_title, object_path
from gpulaunch.model import AttemptPhases, Goodput, JobProgress, JobReport, Manager, RankProgress
from gpulaunch.parts import Controls, Part

INVALID_ARGS = "org.freedesktop.DBus.Error.InvalidArgs"
NOTICES = frozenset({signal.SIGUSR1, signal.SIGUSR2})  # what Signal() passes on
STOPS = frozenset({signal.SIGTERM, signal.SIGINT})  # what Signal() takes as sent to the watcher

FINISH_BUDGET = 1.5  # of the watcher's 2 s for `finished`: never make it raise
# Seconds between attempts to reach a bus that refuses connections (doubling, capped).
RETRY_FIRST, RETRY_MAX = 0.1, 5.0


class PolicyMissingError(AccessDeniedError):
    """The system bus lacks gpulaunch's policy: the job runs, unpublished (a warning)."""


def _consume(fut: asyncio.Future[Any]) -> None:
    """A send's outcome nobody awaits (a lost bus is not the job's problem)."""
    if not fut.cancelled():
        fut.exception()


class JobPublisher(Part):
    """Publishes one job on the bus while its watcher runs; a job `Part`."""

    def __init__(
        self,
        warn: Callable[[str], None] | None = None,
        last_output: Callable[[int], float | None] | None = None,
        optional: bool = False,
        goodput: Callable[[], Goodput | None] | None = None,
        phases: Callable[[], tuple[AttemptPhases, ...]] = tuple,
    ) -> None:
        self._goodput = goodput or (lambda: None)  # the job's so far (progress/timeline.py)
        self._phases = phases  # where each attempt's start went so far (progress/timeline.py)
        self._last_output = last_output or (lambda rank: None)
        self._warn = warn or (lambda text: print(f"gpulaunch: warning: {text}", file=sys.stderr))
        # Signal(): the watcher's notice to its ranks (signal, global rank or None: all),
        # handed in by `attach` with the job's other controls
        self._signal_ranks: Callable[[int, int | None], int] = lambda signum, rank: 0
        self._optional = optional  # no bus is no error (the direct supervisor)
        self._job: JobProgress | None = None
        self._stop_job: Callable[[], None] = lambda: None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._bus: MessageBus | None = None
        self._report: JobReport | None = None
        self._dirty: set[str] = set()
        self._sent: dict[str, Any] = {}  # the values PropertiesChanged last announced
        self._flush_scheduled = False
        self._tasks: set[asyncio.Task[None]] = set()
        self._lost_said = False  # the warning that the bus went away is said once
        self._ended = False  # `finished` ran: no reconnection any more
        self._watching: asyncio.Task[None] | None = None  # notices the bus going away
        self._xml = ""
        self.name = ""
        self.path = ""
        self.owner = os.getuid()

    # -- Part ---------------------------------------------------------------

    def attach(self, job: JobProgress, controls: Controls, loop: asyncio.AbstractEventLoop) -> None:
        self._job = job
        self._stop_job = controls.stop
        self._signal_ranks = controls.signal_ranks
        self._loop = loop
        self.name = bus_name(job.spec.job)
        self.path = object_path(job.spec.job)
        self._xml = interface_xml().replace("</node>", STANDARD_INTERFACES + "</node>")
        self._sent = {name: value for name, (_, value) in self._view().properties().items()}
        try:
            self._serve(loop.run_until_complete(self._open(job.spec.job, job.spec.manager)))
        except PolicyMissingError as exc:  # the job runs; only its API is off
            self._warn(f"{exc.message}; {exc.hint}")
        except NoSystemdError as exc:
            if not self._optional:
                raise
            self._warn(
                f"job {job.spec.job!r} runs without its job API on a bus ({exc.message}); "
                "gpulaunch status, wait and signal read its record file instead"
            )

    def changed(self, job: JobProgress, rank: RankProgress | None) -> None:
        self._job = job
        if self._bus is None:
            return
        self._dirty.update(("Ranks",) if rank is not None else ("State", "Ranks", "Stragglers"))
        if rank is not None and rank.exit is not None and not rank.state.alive:
            self._flush()  # the property first, so a reader woken by the signal sees it
            self._signal_rank_exited(rank)
        elif not self._flush_scheduled and self._loop is not None:
            # Coalesce a burst (every rank forked in one go) into one signal.
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    async def finished(self, job: JobProgress, report: JobReport) -> None:
        self._job = job
        if self._bus is not None:
            self._report = report
            try:
                await asyncio.wait_for(self._finish(), FINISH_BUDGET)
            except Exception as exc:  # the job's status matters more than its publication
                self._warn(f"could not publish the end of the job on the bus: {exc!r}")
        watching, self._watching = self._watching, None
        self._ended = True  # a reconnection whose cancel a library swallowed gives up too
        if watching is not None and not watching.done():
            watching.cancel()  # a reconnection in progress: too late now
            await asyncio.wait([watching])  # gone before the loop closes

    # -- connecting ---------------------------------------------------------

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        assert self._loop is not None
        task = self._loop.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _serve(self, bus: MessageBus) -> None:
        """Publish on `bus` from now on, and on the next one whenever it goes away.

        A callback on the bus's own disconnect future, not a task waiting on it: a
        watcher that fails leaves no task pending (asyncio would log it at exit).
        """
        self._bus = bus
        lost: asyncio.Future[None] = bus._disconnect_future  # noqa: SLF001 (no public hook)

        def on_lost(future: asyncio.Future[None]) -> None:
            _consume(future)  # how it went (EPIPE: the bus stopped) is not the job's concern
            self._on_lost(bus)

        lost.add_done_callback(on_lost)

    def _on_lost(self, bus: MessageBus) -> None:
        if self._bus is not bus or self._loop is None or self._loop.is_closed():
            return  # we let go of it ourselves (the end of the job)
        self._bus = None
        if not self._lost_said:
            self._lost_said = True
            assert self._job is not None
            self._warn(
                f"job {self._job.spec.job}: {bus_title(self._job.spec.manager)} went away; "
                "the job goes on, and is published again when it returns"
            )
        self._watching = self._loop.create_task(self._publish_again())

    async def _publish_again(self) -> None:
        again = await self._reconnect()
        if again is not None and self._ended:  # connected as the job ended: too late
            self._drop(again)
        elif again is not None:
            # Whoever listens reads the properties afresh (their connections were lost too).
            self._sent = {name: value for name, (_, value) in self._view().properties().items()}
            self._serve(again)

    async def _reconnect(self) -> MessageBus | None:
        """Connect again and own the name; retry while the bus refuses us; None: give up."""
        assert self._job is not None
        delay = RETRY_FIRST
        while not self._ended:
            try:
                return await self._open(self._job.spec.job, self._job.spec.manager)
            except NoSystemdError:  # not back yet
                pass
            except GpulaunchError as exc:  # the name is taken or refused: stay unpublished
                self._warn(f"{exc.message}; the job goes on unpublished")
                return None
            except Exception:  # whatever a half-restarted daemon makes of us: try again
                pass
            if self._ended:  # cancelled, and the cancel came back as a failure to connect
                break
            await asyncio.sleep(delay)
            delay = min(delay * 2, RETRY_MAX)
        return None

    async def _open(self, job: str, manager: Manager) -> MessageBus:
        bus = await connect(manager)
        try:
            bus.add_message_handler(self._on_message)
            reply = await asyncio.wait_for(
                bus.request_name(self.name, NameFlag.DO_NOT_QUEUE), CONNECT_TIMEOUT
            )
        except DBusError as exc:
            await self._disconnect(bus)
            raise self._name_error(job, manager, exc) from None
        except asyncio.CancelledError:  # the job ended during a reconnection: let go at once
            self._drop(bus)
            raise
        except BaseException:
            await self._disconnect(bus)
            raise
        if reply not in (RequestNameReply.PRIMARY_OWNER, RequestNameReply.ALREADY_OWNER):
            await self._disconnect(bus)
            raise JobExistsError(
                f"a job named {job!r} is already running ({self.name} on {bus_title(manager)})",
                f"choose another --job, or stop that one: gpulaunch stop {shlex.quote(job)}",
            )
        return bus

    def _name_error(self, job: str, manager: Manager, exc: DBusError) -> GpulaunchError:
        where = bus_title(manager)
        if exc.type != ACCESS_DENIED:
            return NoSystemdError(f"{where} refused to publish job {job!r}: {exc.text}")
        if manager is Manager.SYSTEM and os.geteuid() == 0:
            return PolicyMissingError(
                f"job {job!r} runs without its job API (gpulaunch status, stop and wait do not "
                "see it while it runs): the system bus does not let gpulaunch publish it, "
                "gpulaunch's D-Bus policy is not installed",
                "turn it on: sudo gpulaunch setup",
            )
        if manager is Manager.SYSTEM:
            return AccessDeniedError(
                f"the system bus refused to let uid {os.geteuid()} publish job {job!r}: "
                "access denied (only root runs system jobs)",
                "use --user to run the job under your own user manager",
            )
        return AccessDeniedError(f"{where} refused to publish job {job!r}: {exc.text}")

    @staticmethod
    def _drop(bus: MessageBus) -> None:
        """Let go of `bus` without waiting for its end: a cancelled reconnection (the job
        ended) may not wait up to CONNECT_TIMEOUT for a bus whose daemon went away, longer
        than `finished` has (parts.py's FINISH_TIMEOUT: else an internal error, no report)."""
        forget(bus)
        if bus.connected:
            bus.disconnect()

    @staticmethod
    async def _disconnect(bus: MessageBus) -> None:
        forget(bus)
        if bus.connected:
            bus.disconnect()
            try:
                await asyncio.wait_for(bus.wait_for_disconnect(), CONNECT_TIMEOUT)  # type: ignore[no-untyped-call]
            except Exception:
                pass

    # -- publishing ---------------------------------------------------------

    def _view(self) -> JobView:
        assert self._job is not None
        view = JobView.of_progress(self._job, self._report, self._goodput(), self._phases())
        # Read when asked, never announced: it changes with every line (docs/dbus.md).
        stamps = (self._last_output(r.rank) for r in self._job.ranks)
        return replace(view, last_output=tuple(int((t or 0) * 1e6) for t in stamps))

    def _send(self, msg: Message) -> asyncio.Future[Any] | None:
        if self._bus is None or not self._bus.connected:
            return None
        return send(self._bus, msg)

    def _flush(self) -> None:
        self._flush_scheduled = False
        if not self._dirty:
            return
        props = self._view().properties()
        dirty = sorted(n for n in self._dirty if self._sent.get(n) != props[n][1])
        self._dirty.clear()
        if not dirty:
            return
        changed = {name: Variant(*props[name]) for name in dirty}
        self._sent.update((name, props[name][1]) for name in dirty)
        self._send(
            Message.new_signal(
                self.path, PROPERTIES, "PropertiesChanged", "sa{sv}as", [INTERFACE, changed, []]
            )
        )

    def _signal_rank_exited(self, rank: RankProgress) -> None:
        view = RankView.of_progress(rank)
        self._send(
            Message.new_signal(
                self.path,
                INTERFACE,
                "RankExited",
                RANK_EXITED_SIGNATURE,
                [
                    view.rank,
                    view.state,
                    view.exit_code,
                    view.signal,
                    view.stopped_by_watcher,
                    view.status,
                ],
            )
        )

    async def _finish(self) -> None:
        view = self._view()
        self._dirty.update(n for n in view.properties() if n not in UNANNOUNCED)
        self._flush()
        sent = self._send(
            Message.new_signal(
                self.path,
                INTERFACE,
                "Finished",
                FINISHED_SIGNATURE,
                [
                    view.state.value,
                    view.status,
                    view.cause,
                    view.cause_rank,
                    [r.wire() for r in view.ranks],
                ],
            )
        )
        if sent is not None:
            await sent  # on the wire before we let go of the name
        bus, self._bus = self._bus, None
        if bus is not None:
            await self._disconnect(bus)

    # -- serving ------------------------------------------------------------

    def _on_message(self, msg: Message) -> Message | bool | None:
        if msg.message_type is not MessageType.METHOD_CALL:
            return None
        no_reply = bool(msg.flags & MessageFlag.NO_REPLY_EXPECTED)
        reply = self._dispatch(msg)
        if reply is None or isinstance(reply, bool):
            return reply
        return True if no_reply else reply

    def _dispatch(self, msg: Message) -> Message | bool | None:
        iface, member = msg.interface, msg.member
        if msg.path != self.path:
            if member == "Introspect" and iface in (None, INTROSPECTABLE):
                child = _child_node(self.path, msg.path or "")
                if child is not None:
                    xml = f'<node>\n{STANDARD_INTERFACES}  <node name="{child}"/>\n</node>\n'
                    return Message.new_method_return(msg, "s", [xml])
            return None
        if member == "Introspect" and iface in (None, INTROSPECTABLE):
            return Message.new_method_return(msg, "s", [self._xml])
        if iface == PROPERTIES or (iface is None and member in ("Get", "GetAll", "Set")):
            return self._properties(msg)
        if member in ("Stop", "Signal") and iface in (None, INTERFACE):
            if msg.signature != ("" if member == "Stop" else "ii"):
                return Message.new_error(
                    msg, INVALID_ARGS, f"{member} takes ({'' if member == 'Stop' else 'ii'})"
                )
            self._spawn(self._stop(msg))
            return True
        if iface in (INTERFACE, INTROSPECTABLE):
            return Message.new_error(
                msg,
                "org.freedesktop.DBus.Error.UnknownMethod",
                f"{iface}.{member} with signature {msg.signature!r} does not exist",
            )
        return None  # Peer and the rest: dbus-fast answers

    def _properties(self, msg: Message) -> Message:
        member, body = msg.member, msg.body
        if member == "Set":
            return Message.new_error(
                msg, "org.freedesktop.DBus.Error.PropertyReadOnly", "the properties are read-only"
            )
        if member not in ("Get", "GetAll") or not body or not isinstance(body[0], str):
            return Message.new_error(
                msg, "org.freedesktop.DBus.Error.InvalidArgs", f"bad call of Properties.{member}"
            )
        if body[0] not in ("", INTERFACE):
            return Message.new_error(
                msg, "org.freedesktop.DBus.Error.UnknownInterface", f"no interface {body[0]}"
            )
        props = self._view().properties()
        if member == "GetAll":
            return Message.new_method_return(
                msg, "a{sv}", [{k: Variant(*v) for k, v in props.items()}]
            )
        if msg.signature != "ss" or body[1] not in props:
            return Message.new_error(
                msg, "org.freedesktop.DBus.Error.UnknownProperty", f"no property {body[1:]!r}"
            )
        return Message.new_method_return(msg, "v", [Variant(*props[body[1]])])

    async def _stop(self, msg: Message) -> None:
        try:
            answer = await self._try_stop(msg)
        except Exception as exc:  # a task's exception would only be logged, late
            self._warn(f"{msg.member}() from {msg.sender} failed: {exc!r}")
            answer = Message.new_error(msg, "org.freedesktop.DBus.Error.Failed", repr(exc))
        if not msg.flags & MessageFlag.NO_REPLY_EXPECTED:
            self._send(answer)

    async def _try_stop(self, msg: Message) -> Message:
        """Stop() and Signal(): only the job's owner or root; the caller's uid from the bus."""
        assert self._bus is not None and self._job is not None
        query = Message(
            destination=DBUS,
            path=DBUS_PATH,
            interface=DBUS,
            member="GetConnectionUnixUser",
            signature="s",
            body=[msg.sender],
        )
        reply = await self._bus.call(query)
        if reply.message_type is not MessageType.METHOD_RETURN:
            return Message.new_error(
                msg, ACCESS_DENIED, f"cannot tell who is calling: {reply.error_name}"
            )
        if reply.body[0] not in (0, self.owner):
            return Message.new_error(
                msg,
                ACCESS_DENIED,
                f"uid {reply.body[0]} is neither the owner of job {self._job.spec.job!r} "
                f"(uid {self.owner}) nor root",
            )
        if msg.member == "Signal":
            return self._signal(msg)
        self._stop_job()
        return Message.new_method_return(msg)

    def _signal(self, msg: Message) -> Message:
        """Signal(signal, rank): a notice (SIGUSR1, SIGUSR2) to one rank (-1: all); the job
        goes on. Returns how many ranks got it. SIGTERM, SIGINT (rank -1): as that signal to
        the watcher, which stops the job (the loop sees it as any signal to it)."""
        assert self._job is not None
        signum, rank = int(msg.body[0]), int(msg.body[1])
        if signum in STOPS and rank == -1:
            signal.raise_signal(signum)
            return Message.new_method_return(msg, "u", [len(self._job.ranks)])
        if signum not in NOTICES:
            return Message.new_error(
                msg, INVALID_ARGS, f"signal {signum} is neither a notice (SIGUSR1, SIGUSR2) "
                "nor, for every rank (-1), a stop (SIGTERM, SIGINT)"
            )  # fmt: skip
        ranks = {r.rank for r in self._job.ranks}
        if rank != -1 and rank not in ranks:
            return Message.new_error(
                msg,
                INVALID_ARGS,
                f"rank {rank} is not one of this node's ({min(ranks)}-{max(ranks)})",
            )
        sent = self._signal_ranks(signum, None if rank == -1 else rank)
        return Message.new_method_return(msg, "u", [sent])


def _child_node(path: str, parent: str) -> str | None:
    """The element of `path` right below `parent`, if `parent` is one of its ancestors."""
    prefix = parent.rstrip("/") + "/"
    if not path.startswith(prefix) or parent == path:
        return None
    return path[len(prefix) :].split("/", 1)[0]
