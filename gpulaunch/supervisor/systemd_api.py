"""The one module that talks to systemd (through pystemd).

It speaks `str` and dataclasses to the rest of gpulaunch and turns pystemd's
D-Bus exceptions into `GpulaunchError`s that name the unit.

Why it builds the StartTransientUnit arguments itself: pystemd looks
property signatures up in a global table that lacks several we need (`PIDs`,
`CPUWeight`, `AllowedCPUs`, `DeviceAllow`, ...). Every `Property` from the
codec carries its own signature, so we encode it with pystemd's
`apply_signature` and never patch pystemd's table.

Faults of the environment it survives (issue 13):

- **Signals during a call.** sd-bus's synchronous calls wait in ppoll(), which
  a signal interrupts (EINTR); the call's outcome is then unknown (the request
  may have reached systemd). So every call runs with the process's signals
  blocked (`_signals_held`): they stay pending and reach the watcher's wakeup
  fd right after the call. EINTR is never an error.
- **A lost connection.** As root, the system manager is reached on its private
  socket (`/run/systemd/private`), which needs no D-Bus daemon: `systemctl
  restart dbus` does not touch it. `systemctl daemon-reexec` closes every
  connection (the system bus's too, for the calls in flight): `events` raises
  `ConnectionLost`, and the caller `reconnect`s, subscribes again and reads the
  state of the units whose jobs it was waiting for (their `JobRemoved` may be
  lost). The caller reconnects: it owns the watch on the connection's fd.
"""

from __future__ import annotations

import errno
import signal
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Protocol

from pystemd.dbusexc import (
    DBusAccessDeniedError,
    DBusBaseError,
    DBusInteractiveAuthorizationRequiredError,
    DBusInvalidArgsError,
    DBusNoReplyError,
    DBusNoSuchUnitError,
    DBusPropertyReadOnlyError,
    DBusUnixProcessIdUnknownError,
)
from pystemd.dbuslib import DBus, DBusAddress, apply_signature

from gpulaunch.base.userbus import user_private_socket
from gpulaunch.errors import (
    AccessDeniedError,
    JobExistsError,
    NoSystemdError,
    StoppedWhileStartingError,
    SystemdError,
    TemplateError,
)
from gpulaunch.model import Manager
from gpulaunch.supervisor.reach import retry, root_private_socket
from gpulaunch.units.codec import Property

_DEST = b"org.freedesktop.systemd1"
_PATH = b"/org/freedesktop/systemd1"
_MANAGER = b"org.freedesktop.systemd1.Manager"
_UNIT = b"org.freedesktop.systemd1.Unit"
_PROPERTIES = b"org.freedesktop.DBus.Properties"
_UNIT_EXISTS = "org.freedesktop.systemd1.UnitExists"
# A unit of a slice whose stop job is queued cannot be started: stopped from outside.
_DESTRUCTIVE = "org.freedesktop.systemd1.TransactionIsDestructive"
# What sd-bus answers once the peer closed the connection (or never answered).
_LOST = frozenset({errno.ECONNRESET, errno.ENOTCONN, errno.EPIPE, errno.ESHUTDOWN})
# Signals we hold during a synchronous call: every catchable one that is not a fault.
_BLOCKED = frozenset(signal.valid_signals()) - {
    signal.SIGKILL,
    signal.SIGSTOP,
    signal.SIGSEGV,
    signal.SIGBUS,
    signal.SIGFPE,
    signal.SIGILL,
    signal.SIGTRAP,
    signal.SIGSYS,
    signal.SIGABRT,
}
# pystemd's process() hides sd_bus_process()'s "did work" result, and sd-bus
# sometimes does internal work (a reply to one of its own calls) that fires
# no callback. Every message that reaches us fires one of ours, so a few calls
# in a row that fire nothing mean the queue is empty (costs microseconds).
_QUIET_CALLS = 3

NO_SYSTEMD_HINT = (
    "gpulaunch needs a running systemd: on a host booted with it, or in a container "
    "that runs it as PID 1 (e.g. podman run --systemd=always)"
)


class ConnectionLost(Exception):
    """The connection to the manager is gone (daemon-reexec, a bus restart): `reconnect`."""


@contextmanager
def _signals_held() -> Iterator[None]:
    """Block signals for the duration of a synchronous call (see the module docstring)."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, _BLOCKED)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _lost(exc: BaseException) -> bool:
    return isinstance(exc, DBusBaseError) and abs(getattr(exc, "errno", 0) or 0) in _LOST


@dataclass(frozen=True)
class UnitState:
    """A unit's `ActiveState` and whether a job of it is still queued or running."""

    active: str
    job_pending: bool
    job: str = ""  # the object path of that job ("" if none)


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
        self,
        name: str,
        properties: Sequence[Property],
        pids: Sequence[int] = (),
        aux: Sequence[tuple[str, Sequence[Property]]] = (),
    ) -> str: ...

    def stop_unit(self, name: str) -> str | None: ...

    def kill_unit(self, name: str, signum: int) -> None: ...

    def ping(self) -> None: ...

    def events(self) -> list[JobEvent]: ...

    def reconnect(self) -> None: ...

    def unit_state(self, name: str) -> UnitState: ...


def _text(value: object) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


def _error_name(exc: DBusBaseError) -> str:
    return _text(getattr(exc, "err_name", "") or "")


def _error_message(exc: BaseException) -> str:
    return _text(getattr(exc, "err_message", "") or "") or str(exc)


class _Counter:
    """A pystemd signal callback.

    pystemd keeps only a borrowed reference to the callback and stores its
    userdata on the callable itself (docs/systemd-facts.md): so each match gets its
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
        try:  # one that exists but does not answer yet is asked again (supervisor/reach.py)
            retry(self._open, (ConnectionLost, NoSystemdError), self.manager)
        except ConnectionLost as exc:
            raise self._no_manager(exc) from exc
        return self

    def _open(self) -> None:
        user = self.manager is Manager.USER  # a user's own socket only where there is no bus
        socket = user_private_socket() if user else root_private_socket()
        private = socket is not None
        bus: Any = (
            DBusAddress(f"unix:path={socket}".encode(), peer_to_peer=True)
            if socket is not None
            else DBus(user_mode=self.manager is Manager.USER)
        )
        try:
            with _signals_held():
                bus.open()
        except DBusBaseError as exc:
            raise self._no_manager(exc) from exc
        self._bus = bus
        self._callbacks = []
        try:
            self._call(b"Subscribe", [], what="subscribe to")
            # Everything the bus daemon sends us unasked must hit a callback too,
            # so that `events` can tell an empty queue (see _QUIET_CALLS).
            # A direct connection's messages carry no sender: match any.
            for member in (b"JobNew", b"JobRemoved"):
                jobs = _Counter(self._jobs, member.decode())
                self._callbacks.append(jobs)
                bus.match_signal(None if private else _DEST, _PATH, _MANAGER, member, jobs)
            if private:
                # No bus daemon filters what systemd sends a direct connection: after
                # Subscribe it gets every signal (UnitNew, UnitRemoved, JobNew, each
                # unit's PropertiesChanged). An outside stop of the job sends a burst of
                # them; without a callback for each, `events` took them for "nothing
                # left" and stopped draining, and the JobRemoved queued behind them was
                # never seen: the watcher waited for it until systemd SIGKILLed it.
                # A local match (no AddMatch on a direct connection) that counts them all.
                everything = _Counter(None)
                self._callbacks.append(everything)
                bus.match_signal(None, None, None, None, everything)
            else:
                for member in (b"NameAcquired", b"NameLost"):
                    counter = _Counter(None)
                    self._callbacks.append(counter)
                    bus.match_signal(
                        b"org.freedesktop.DBus", None, b"org.freedesktop.DBus", member, counter
                    )
        except BaseException:
            self.close()
            raise

    def reconnect(self) -> None:
        """A new connection after `ConnectionLost`, subscribed again; a new `fileno`.

        Jobs that finished while we were away sent their `JobRemoved` to nobody:
        ask `unit_state` about the ones you were waiting for.
        """
        self.close()
        self._open()

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

    def _no_manager(self, exc: BaseException) -> NoSystemdError:
        if self.manager is Manager.USER:
            return NoSystemdError(
                f"cannot reach your systemd user manager ({_error_message(exc)})",
                "log in through a session that starts user@$UID.service, or run "
                "`loginctl enable-linger $USER`; as root, use --system",
            )
        return NoSystemdError(
            f"cannot reach the systemd system manager ({_error_message(exc)})", NO_SYSTEMD_HINT
        )

    def _call(
        self,
        method: bytes,
        args: list[Any],
        *,
        what: str,
        unit: str = "",
        path: bytes = _PATH,
        interface: bytes = _MANAGER,
    ) -> Any:
        try:
            with _signals_held():
                reply = self._bus.call_method(_DEST, path, interface, method, args)
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
            if _lost(exc) or isinstance(exc, DBusNoReplyError):
                raise ConnectionLost(f"{what} {unit}: {_error_message(exc)}") from exc
            raise
        return reply.body

    def start_transient(
        self,
        name: str,
        properties: Sequence[Property],
        pids: Sequence[int] = (),
        aux: Sequence[tuple[str, Sequence[Property]]] = (),
    ) -> str:
        """Ask systemd to create and start a transient unit; returns the start job's path.

        `aux`: units created in the same call (all of them or none), started
        only as the main unit's dependencies. The reply comes before the job
        ran: wait for `JobDone` with this path. `ConnectionLost`: whether the
        unit was created is unknown (reconnect and ask `unit_state`).
        """
        args: list[Any] = apply_signature(b"ss", [name.encode(), b"fail"])
        props = list(properties)
        if pids:
            props.append(Property("PIDs", "au", list(pids)))
        args += _properties(props)
        args += [(ord("a"), b"(sa(sv))")]
        for aux_name, aux_props in aux:
            args += [(ord("r"), b"sa(sv)"), (ord("s"), aux_name.encode())]
            args += _properties(aux_props) + [(-1, None)]
        args += [(-1, None)]
        try:
            path = self._call(b"StartTransientUnit", args, what="create", unit=name)
        except DBusBaseError as exc:
            raise self._start_error(name, exc) from exc
        return _text(path)

    def _start_error(self, name: str, exc: DBusBaseError) -> Exception:
        message = _error_message(exc)
        if _error_name(exc) == _UNIT_EXISTS:
            return JobExistsError(f"unit {name} already exists", None)
        if _error_name(exc) == _DESTRUCTIVE:
            return StoppedWhileStartingError(
                f"the job was stopped from outside while it started ({name}: {message})"
            )
        if isinstance(exc, DBusPropertyReadOnlyError):
            return TemplateError(f"systemd refused a setting of {name}: {message}")
        if isinstance(exc, DBusInvalidArgsError):
            return TemplateError(f"systemd refused {name}: {message}")
        if isinstance(exc, DBusUnixProcessIdUnknownError):
            return SystemdError(f"cannot move the process into {name}: {message}")
        return SystemdError(f"systemd could not create {name}: {message}")

    def stop_unit(self, name: str) -> str | None:
        """Stop a unit; returns the stop job's path, or None if it is not loaded.

        Stopping twice is harmless: after `ConnectionLost`, ask again.
        """
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

    def unit_state(self, name: str) -> UnitState:
        """`ActiveState` of a unit ("inactive" if it is not loaded) and whether it has a job."""
        try:
            path = self._call(b"GetUnit", apply_signature(b"s", [name.encode()]), what="find")
            props = self._call(
                b"GetAll",
                apply_signature(b"s", [_UNIT]),
                what="read",
                unit=name,
                path=path if isinstance(path, bytes) else str(path).encode(),
                interface=_PROPERTIES,
            )
        except DBusNoSuchUnitError:
            return UnitState("inactive", False)
        except DBusBaseError as exc:
            if _error_name(exc) == "org.freedesktop.DBus.Error.UnknownObject":
                return UnitState("inactive", False)  # garbage-collected in between
            raise SystemdError(f"systemd could not tell the state of {name}: {exc}") from exc
        values = {_text(k): v for k, v in (props.items() if isinstance(props, dict) else props)}
        job = values.get("Job", (0, b"/"))
        pending = bool(job and job[0])
        return UnitState(
            _text(values.get("ActiveState", b"inactive")), pending, _text(job[1]) if pending else ""
        )

    def ping(self) -> None:
        """A round trip to systemd: what it sent before its reply is then in our queue.

        systemd announces a job (`JobNew`) before it runs it, so after a ping
        `events` has every stop job whose SIGTERM a rank could have died of.
        """
        try:
            with _signals_held():
                self._bus.call_method(_DEST, _PATH, b"org.freedesktop.DBus.Peer", b"Ping", [])
        except DBusBaseError:
            pass  # only an ordering aid: without it the events come a little later

    def events(self) -> list[JobEvent]:
        """Dispatch everything the bus has for us: the jobs queued and finished, in order.

        Raises `ConnectionLost` when the connection is gone (then `reconnect`).
        """
        quiet = 0
        while quiet < _QUIET_CALLS:
            fired = sum(c.fired for c in self._callbacks)
            try:
                self._bus.process()
            except DBusBaseError as exc:
                if _lost(exc):
                    raise ConnectionLost(_error_message(exc)) from exc
                raise
            quiet = quiet + 1 if sum(c.fired for c in self._callbacks) == fired else 0
        out: list[JobEvent] = [
            JobDone(path=_text(body[1]), unit=_text(body[2]), result=_text(body[3]))
            if kind == "JobRemoved"
            else JobQueued(path=_text(body[1]), unit=_text(body[2]))
            for kind, body in self._jobs
        ]
        self._jobs.clear()
        return out


def _properties(props: Sequence[Property]) -> list[Any]:
    """An `a(sv)` of typed properties, in pystemd's argument form."""
    args: list[Any] = [(ord("a"), b"(sv)")]
    for prop in props:
        sig = prop.signature.encode()
        args += [(ord("r"), b"sv"), (ord("s"), prop.name.encode()), (ord("v"), sig)]
        args += apply_signature(sig, [_encode(prop.value)])
        args += [(-1, None), (-1, None)]
    return args + [(-1, None)]


def _encode(value: object) -> object:
    """Strings as bytes, recursively: the form pystemd's encoder expects."""
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, list):
        return [_encode(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_encode(v) for v in value)
    return value
