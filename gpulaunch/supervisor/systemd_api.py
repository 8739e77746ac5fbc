"""The one module that talks to systemd (through pystemd).

It speaks `str` and dataclasses to the rest of gpulaunch and turns pystemd's
D-Bus exceptions into `GpulaunchError`s that name the unit.

Why it builds the StartTransientUnit arguments itself: pystemd looks
property signatures up in a global table that lacks several we need (`PIDs`,
`CPUWeight`, `AllowedCPUs`, `DeviceAllow`, ...). Every `Property` from the
codec carries its own signature, so we encode it with pystemd's
`apply_signature` and never patch pystemd's table.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Protocol

from pystemd.dbusexc import (
    DBusAccessDeniedError,
    DBusBaseError,
    DBusInteractiveAuthorizationRequiredError,
    DBusInvalidArgsError,
    DBusNoSuchUnitError,
    DBusPropertyReadOnlyError,
    DBusUnixProcessIdUnknownError,
)
from pystemd.dbuslib import DBus, apply_signature

from gpulaunch.errors import (
    AccessDeniedError,
    JobExistsError,
    NoSystemdError,
    SystemdError,
    TemplateError,
)
from gpulaunch.model import Manager
from gpulaunch.units.codec import Property

_DEST = b"org.freedesktop.systemd1"
_PATH = b"/org/freedesktop/systemd1"
_MANAGER = b"org.freedesktop.systemd1.Manager"
_UNIT_EXISTS = "org.freedesktop.systemd1.UnitExists"
# pystemd's process() hides sd_bus_process()'s "did work" result, and sd-bus
# sometimes does internal work (a reply to one of its own calls) that fires
# no callback. Every message that reaches us fires one of ours, so a few calls
# in a row that fire nothing mean the queue is empty (costs microseconds).
_QUIET_CALLS = 3

NO_SYSTEMD_HINT = (
    "gpulaunch needs a running systemd: on a host booted with it, or in a container "
    "that runs it as PID 1 (e.g. podman run --systemd=always)"
)


@dataclass(frozen=True)
class JobDone:
    """systemd finished a job (`JobRemoved`): `result` is done, failed, canceled, ..."""

    path: str
    unit: str
    result: str


@dataclass(frozen=True)
class JobQueued:
    """systemd queued a job (`JobNew`): ours, or someone else's (`systemctl stop`)."""

    path: str
    unit: str


JobEvent = JobDone | JobQueued


class SystemdAPI(Protocol):
    """What the watcher needs from systemd; `tests/unit` provides a fake."""

    def fileno(self) -> int: ...

    def start_transient(
        self, name: str, properties: Sequence[Property], pids: Sequence[int] = ()
    ) -> str: ...

    def stop_unit(self, name: str) -> str | None: ...

    def kill_unit(self, name: str, signum: int) -> None: ...

    def ping(self) -> None: ...

    def events(self) -> list[JobEvent]: ...


def _text(value: object) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


def _error_name(exc: DBusBaseError) -> str:
    return _text(getattr(exc, "err_name", "") or "")


def _error_message(exc: DBusBaseError) -> str:
    return _text(getattr(exc, "err_message", "") or "") or str(exc)


class _Counter:
    """A pystemd signal callback.

    pystemd keeps only a borrowed reference to the callback and stores its
    userdata on the callable itself (systemd-facts.md): so each match gets its
    own instance, and the connection keeps every instance referenced.
    """

    def __init__(self, sink: list[tuple[str, Any]] | None, kind: str = "") -> None:
        self.sink = sink
        self.kind = kind
        self.fired = 0
        self.metadata: dict[str, Any] = {}

    def __call__(self, msg: Any, error: Any = None, userdata: Any = None) -> None:
        self.fired += 1
        if self.sink is not None:
            msg.process_reply(False)
            self.sink.append((self.kind, msg.body))


class Systemd:
    """A connection to the system or user manager; a context manager."""

    def __init__(self, manager: Manager) -> None:
        self.manager = manager
        self._bus: Any = None
        self._jobs: list[tuple[str, Any]] = []  # JobNew and JobRemoved, in order
        self._callbacks: list[_Counter] = []

    def __enter__(self) -> Systemd:
        user = self.manager is Manager.USER
        bus = DBus(user_mode=user)
        try:
            bus.open()
        except DBusBaseError as exc:
            raise self._no_manager(exc) from exc
        self._bus = bus
        try:
            self._call(b"Subscribe", [], what="subscribe to")
            # Everything the bus daemon sends us unasked must hit a callback too,
            # so that `events` can tell an empty queue (see _QUIET_CALLS).
            for member in (b"JobNew", b"JobRemoved"):
                jobs = _Counter(self._jobs, member.decode())
                self._callbacks.append(jobs)
                bus.match_signal(_DEST, _PATH, _MANAGER, member, jobs)
            for member in (b"NameAcquired", b"NameLost"):
                counter = _Counter(None)
                self._callbacks.append(counter)
                bus.match_signal(
                    b"org.freedesktop.DBus", None, b"org.freedesktop.DBus", member, counter
                )
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        if self._bus is not None:
            self._bus.close()
            self._bus = None

    def fileno(self) -> int:
        fd: int = self._bus.get_fd()
        return fd

    def _no_manager(self, exc: DBusBaseError) -> NoSystemdError:
        if self.manager is Manager.USER:
            return NoSystemdError(
                f"cannot reach your systemd user manager ({_error_message(exc)})",
                "log in through a session that starts user@$UID.service, or run "
                "`loginctl enable-linger $USER`; as root, use --system",
            )
        return NoSystemdError(
            f"cannot reach the systemd system manager ({_error_message(exc)})", NO_SYSTEMD_HINT
        )

    def _call(self, method: bytes, args: list[Any], *, what: str, unit: str = "") -> Any:
        try:
            reply = self._bus.call_method(_DEST, _PATH, _MANAGER, method, args)
        except (DBusAccessDeniedError, DBusInteractiveAuthorizationRequiredError) as exc:
            where = "the system manager" if self.manager is Manager.SYSTEM else "your user manager"
            raise AccessDeniedError(
                f"{where} refused to {what} {unit}: access denied".replace("  ", " "),
                "run as root for the system manager, or use --user to run the job "
                "under your own user manager",
            ) from exc
        except DBusBaseError as exc:
            name = _error_name(exc)
            if name in (
                "org.freedesktop.DBus.Error.ServiceUnknown",
                "org.freedesktop.DBus.Error.NameHasNoOwner",
            ) or type(exc).__name__ in ("DBusServiceUnknownError", "DBusNameHasNoOwnerError"):
                raise self._no_manager(exc) from exc
            raise
        return reply.body

    def start_transient(
        self, name: str, properties: Sequence[Property], pids: Sequence[int] = ()
    ) -> str:
        """Ask systemd to create and start a transient unit; returns the start job's path.

        The reply comes before the job ran: wait for `JobDone` with this path.
        """
        args: list[Any] = apply_signature(b"ss", [name.encode(), b"fail"])
        props = list(properties)
        if pids:
            props.append(Property("PIDs", "au", list(pids)))
        args += [(ord("a"), b"(sv)")]
        for prop in props:
            sig = prop.signature.encode()
            args += [(ord("r"), b"sv"), (ord("s"), prop.name.encode()), (ord("v"), sig)]
            args += apply_signature(sig, [_encode(prop.value)])
            args += [(-1, None), (-1, None)]
        args += [(-1, None)]
        args += [(ord("a"), b"(sa(sv))"), (-1, None)]  # no auxiliary units
        try:
            path = self._call(b"StartTransientUnit", args, what="create", unit=name)
        except DBusBaseError as exc:
            raise self._start_error(name, exc) from exc
        return _text(path)

    def _start_error(self, name: str, exc: DBusBaseError) -> Exception:
        message = _error_message(exc)
        if _error_name(exc) == _UNIT_EXISTS:
            return JobExistsError(f"unit {name} already exists", None)
        if isinstance(exc, DBusPropertyReadOnlyError):
            return TemplateError(f"systemd refused a setting of {name}: {message}")
        if isinstance(exc, DBusInvalidArgsError):
            return TemplateError(f"systemd refused {name}: {message}")
        if isinstance(exc, DBusUnixProcessIdUnknownError):
            return SystemdError(f"cannot move the process into {name}: {message}")
        return SystemdError(f"systemd could not create {name}: {message}")

    def stop_unit(self, name: str) -> str | None:
        """Stop a unit; returns the stop job's path, or None if it is not loaded."""
        try:
            path = self._call(
                b"StopUnit",
                apply_signature(b"ss", [name.encode(), b"replace"]),
                what="stop",
                unit=name,
            )
        except DBusNoSuchUnitError:
            return None
        except DBusBaseError as exc:
            raise SystemdError(f"systemd could not stop {name}: {_error_message(exc)}") from exc
        return _text(path)

    def kill_unit(self, name: str, signum: int) -> None:
        """Send `signum` to every process of a unit at once (no stop job, no grace)."""
        try:
            self._call(
                b"KillUnit",
                apply_signature(b"ssi", [name.encode(), b"all", signum]),
                what="kill",
                unit=name,
            )
        except DBusNoSuchUnitError:
            return
        except DBusBaseError as exc:
            raise SystemdError(f"systemd could not kill {name}: {_error_message(exc)}") from exc

    def ping(self) -> None:
        """A round trip to systemd: what it sent before its reply is then in our queue.

        systemd announces a job (`JobNew`) before it runs it, so after a ping
        `events` has every stop job whose SIGTERM a rank could have died of.
        """
        try:
            self._bus.call_method(_DEST, _PATH, b"org.freedesktop.DBus.Peer", b"Ping", [])
        except DBusBaseError:
            pass  # only an ordering aid: without it the events come a little later

    def events(self) -> list[JobEvent]:
        """Dispatch everything the bus has for us: the jobs queued and finished, in order."""
        quiet = 0
        while quiet < _QUIET_CALLS:
            fired = sum(c.fired for c in self._callbacks)
            self._bus.process()
            quiet = quiet + 1 if sum(c.fired for c in self._callbacks) == fired else 0
        out: list[JobEvent] = [
            JobDone(path=_text(body[1]), unit=_text(body[2]), result=_text(body[3]))
            if kind == "JobRemoved"
            else JobQueued(path=_text(body[1]), unit=_text(body[2]))
            for kind, body in self._jobs
        ]
        self._jobs.clear()
        return out


def _encode(value: object) -> object:
    """Strings as bytes, recursively: the form pystemd's encoder expects."""
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, list):
        return [_encode(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_encode(v) for v in value)
    return value
