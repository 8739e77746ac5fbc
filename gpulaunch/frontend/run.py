"""The front end: start the watcher as a service of the user manager, relay, exit as it did.

One asyncio loop on the user bus (dbus_fast): it creates the service
(`unit.py`) with this process's stdin, stdout and stderr, takes the bus name
that ties the service's life to ours once the service is starting, relays
SIGINT/SIGTERM/SIGHUP to the watcher (`KillUnit` on its main process: the
watcher's own rules apply, first = graceful stop, second = kill), and when the
service has ended reads the watcher's exit status and returns it. The live
output never passes through here: the watcher writes to our fds itself. Until
our name holds the service, the watcher holds a pidfd of us (tether.py): our
end in between stops the service too, at once.

`--detach`: the service's stderr is a pipe to us until the job's units exist
(base/detach.py's protocol); then we print the job id and return 0.

The session bus going away (`systemctl --user restart dbus`) takes our name
with it, and systemd stops the service as if we had died (`Type=dbus`): the
job ends as for a SIGTERM, and is recorded. We hold a pidfd of the watcher
from when our name ties it to us, so we wait for it to end (signals are
relayed through the pidfd then), and exit with the status its record gives,
after one line that says what happened.

Without a user bus (base/userbus.py) we talk to the user manager on its
private socket, peer to peer: no bus daemon, so no `AddMatch` (systemd sends a
direct connection every signal after `Subscribe`) and no name of ours; the
service is `Type=exec` and the tie service (units/tie.service) stops it when we end.
"""

from __future__ import annotations

import asyncio
import os
import resource
import signal
import sys
from collections.abc import Sequence
from typing import Any

from dbus_fast import Message, MessageType, Variant
from dbus_fast.aio import MessageBus
from dbus_fast.constants import NameFlag, RequestNameReply
from dbus_fast.errors import AuthError, InvalidAddressError

from gpulaunch.base.detach import STARTED, tail_overlap
from gpulaunch.base.names import unit_object_path
from gpulaunch.base.userbus import LINGER_HINT, UserManager
from gpulaunch.errors import (
    AccessDeniedError,
    JobExistsError,
    JobLostError,
    NoSystemdError,
    SystemdError,
)
from gpulaunch.frontend import tether
from gpulaunch.frontend.peerbus import PeerBus
from gpulaunch.frontend.unit import (
    RELAYED,
    RLIMITS,
    Prop,
    environment,
    exit_status,
    frontend_bus_name,
    launch_setup,
    service_properties,
    watcher_argv,
)
from gpulaunch.jobapi import record
from gpulaunch.model import JobSpec, Manager
from gpulaunch.units.definitions import JobUnits

_SYSTEMD = "org.freedesktop.systemd1"
_MANAGER_PATH = "/org/freedesktop/systemd1"
_MANAGER = "org.freedesktop.systemd1.Manager"
_UNIT = "org.freedesktop.systemd1.Unit"
_SERVICE = "org.freedesktop.systemd1.Service"
_PROPERTIES = "org.freedesktop.DBus.Properties"
_CONNECT_TIMEOUT = 5.0
_ENDED = ("inactive", "failed")
_MAIN_EXIT = ("ExecMainExitTimestampMonotonic", "ExecMainCode", "ExecMainStatus")
# The manager is off the bus for a moment (daemon-reexec): not there, or gone mid-call.
_NO_REPLY = "org.freedesktop.DBus.Error.NoReply"
_MANAGER_AWAY = (
    "org.freedesktop.DBus.Error.ServiceUnknown",
    "org.freedesktop.DBus.Error.NameHasNoOwner",
    _NO_REPLY,
)
_MANAGER_BACK_S = 5.0  # how long a manager that was there may take to be back


def run_frontend(
    spec: JobSpec, argv: Sequence[str], manager: UserManager, detach: bool, units: JobUnits
) -> int:
    """Run the job through a watcher service of the user manager; returns the job's status."""
    return asyncio.run(_FrontEnd(spec, argv, manager, detach, units).run())


class _FrontEnd:
    def __init__(
        self,
        spec: JobSpec,
        argv: Sequence[str],
        manager: UserManager,
        detach: bool,
        units: JobUnits,
    ) -> None:
        self.spec = spec
        self.units = units
        self.service = spec.names.launch_service
        self.path = unit_object_path(self.service)
        self.address = manager.address
        self.peer = manager.peer  # the manager's private socket: no bus names (units/tie.service)
        self.detach = detach
        self.argv = watcher_argv(sys.executable, argv, spec.job)
        self.name = None if detach or self.peer else frontend_bus_name(os.getpid())
        self.bus: MessageBus | None = None
        self.started = False  # StartTransientUnit succeeded
        self.claimed = False  # we own self.name: the service's life is tied to ours
        self.pending: list[int] = []  # signals that came before the service existed
        self.changed = asyncio.Event()
        self.state: dict[str, str] = {}
        # Peer to peer (no AddRef): the watcher's exit as systemd announced it, since
        # the ended service may be collected before we ask
        self.main_exit: dict[str, int] = {}
        self.lost = False  # the bus went away under us
        self.watcher = -1  # a pidfd of the watcher, once our name ties it to us

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for signum in RELAYED:
            loop.add_signal_handler(signum, self._on_signal, signum)
        self.bus = await self._connect()
        noticed = loop.create_task(self._notice_loss(self.bus))
        try:
            await self._watch_unit()
            if self.detach:
                return await self._run_detached()
            await self._start((0, 1, 2))
            return await self._until_ended()
        except _Interrupted as exc:
            return 128 + exc.signum  # before anything was created
        finally:
            self.bus.disconnect()  # drops AddRef: systemd collects the ended service
            noticed.cancel()
            if self.watcher >= 0:
                os.close(self.watcher)

    async def _notice_loss(self, bus: MessageBus) -> None:
        try:
            # shielded: a cancel must not cancel the bus's own disconnect future
            await asyncio.shield(bus.wait_for_disconnect())  # type: ignore[no-untyped-call]
        except Exception:
            pass
        self.lost = True
        self.changed.set()

    async def _connect(self) -> MessageBus:
        try:
            kind = PeerBus if self.peer else MessageBus
            bus = kind(bus_address=self.address, negotiate_unix_fd=True)
            return await asyncio.wait_for(bus.connect(), _CONNECT_TIMEOUT)
        except (OSError, AuthError, InvalidAddressError, TimeoutError) as exc:
            reason = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
            raise NoSystemdError(
                f"cannot reach your systemd user manager's bus at {self.address} ({reason})",
                LINGER_HINT.format(uid=os.getuid()),
            ) from None

    async def _call(self, msg: Message, what: str) -> Any:
        assert self.bus is not None
        reply = await self._call_again(msg)
        if reply.message_type is MessageType.ERROR:
            text = reply.body[0] if reply.body else reply.error_name
            if reply.error_name == "org.freedesktop.systemd1.UnitExists":
                raise JobExistsError(f"job {self.spec.job} is already running ({text})", None)
            if reply.error_name in (
                "org.freedesktop.DBus.Error.AccessDenied",
                "org.freedesktop.DBus.Error.InteractiveAuthorizationRequired",
            ):
                raise AccessDeniedError(f"your user manager refused to {what}: {text}")
            if reply.error_name in (
                "org.freedesktop.DBus.Error.ServiceUnknown",
                "org.freedesktop.DBus.Error.NameHasNoOwner",
            ):
                raise NoSystemdError(
                    f"cannot reach your systemd user manager ({text})",
                    LINGER_HINT.format(uid=os.getuid()),
                )
            raise SystemdError(f"your user manager could not {what}: {text}")
        return reply.body

    async def _call_again(self, msg: Message) -> Message:
        """The reply; asked again while the manager is briefly off the bus (a daemon-reexec:
        not on the bus, or it left without replying), within `_MANAGER_BACK_S`.

        A StartTransientUnit whose reply was lost may have created the service: asked
        again, it is "UnitExists", and the service is ours if it names our bus name
        (`--detach`: no name; a job id is started by one front end at a time).
        """
        assert self.bus is not None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + _MANAGER_BACK_S
        delay = 0.02
        lost_reply = False
        while True:
            msg.serial = 0  # a fresh serial for each try (dbus-fast assigns it)
            reply = await self.bus.call(msg)
            assert reply is not None
            transient = reply.error_name in _MANAGER_AWAY
            if not transient or loop.time() + delay > deadline:
                break
            lost_reply = lost_reply or reply.error_name == _NO_REPLY
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.5)
        if (
            lost_reply
            and msg.member == "StartTransientUnit"
            and reply.error_name == "org.freedesktop.systemd1.UnitExists"
            and (self.name is None or await self._names_us())
        ):
            return Message(message_type=MessageType.METHOD_RETURN, reply_serial=msg.serial)
        return reply

    async def _names_us(self) -> bool:
        """Whether the service that exists is the one we asked for (its BusName= is ours)."""
        try:
            return bool((await self._get_all(_SERVICE))["BusName"].value == self.name)
        except (SystemdError, KeyError):
            return False

    def _manager_call(self, member: str, signature: str, body: list[Any], **kw: Any) -> Message:
        return Message(
            destination=_SYSTEMD,
            path=_MANAGER_PATH,
            interface=_MANAGER,
            member=member,
            signature=signature,
            body=body,
            **kw,
        )

    async def _watch_unit(self) -> None:
        """PropertiesChanged of the service, from before it exists (nothing is missed)."""
        assert self.bus is not None
        rule = (
            f"type='signal',sender='{_SYSTEMD}',path='{self.path}',"
            f"interface='{_PROPERTIES}',member='PropertiesChanged'"
        )
        if not self.peer:  # peer to peer, systemd sends every signal after Subscribe
            await self._call(
                Message(
                    destination="org.freedesktop.DBus",
                    path="/org/freedesktop/DBus",
                    interface="org.freedesktop.DBus",
                    member="AddMatch",
                    signature="s",
                    body=[rule],
                ),
                "watch the job",
            )
        self.bus.add_message_handler(self._on_message)
        await self._call(self._manager_call("Subscribe", "", []), "watch the job")

    def _on_message(self, msg: Message) -> None:
        if (
            msg.message_type is MessageType.SIGNAL
            and msg.path == self.path
            and msg.member == "PropertiesChanged"
            and msg.body
            and msg.body[0] == _UNIT
        ):
            for key in ("ActiveState", "SubState"):
                if key in msg.body[1]:
                    self.state[key] = msg.body[1][key].value
            self.changed.set()
        elif (
            msg.message_type is MessageType.SIGNAL
            and msg.path == self.path
            and msg.member == "PropertiesChanged"
            and msg.body
            and msg.body[0] == _SERVICE
        ):  # systemd sends the service's changes before the unit's (ExecMain* among them)
            for key in _MAIN_EXIT:
                if key in msg.body[1]:
                    self.main_exit[key] = msg.body[1][key].value

    def _on_signal(self, signum: int) -> None:
        if not self.started:
            self.pending.append(signum)
            return
        asyncio.get_running_loop().create_task(self._relay(signum))

    async def _relay(self, signum: int) -> None:
        if self.lost and self.watcher >= 0:
            signal.pidfd_send_signal(self.watcher, signum)
            return
        # "main": the watcher itself; it stops the ranks by its own rules.
        msg = self._manager_call("KillUnit", "ssi", [self.service, "main", signum])
        try:
            await self._call(msg, f"pass {signal.Signals(signum).name} to the watcher")
        except (SystemdError, OSError):
            pass  # the watcher has already ended (its status is on its way), or the bus

    async def _start(self, fds: tuple[int, int, int]) -> None:
        env, dropped = environment(os.environ)
        if self.name is not None:  # its watcher stops if we end before our name holds it
            env.append(f"{tether.ENV}={tether.identity(os.getpid())}")
        if dropped:
            print(
                f"gpulaunch: warning: systemd takes no environment variable named like "
                f"{', '.join(dropped)} (or with such a value): the ranks will not see it",
                file=sys.stderr,
            )
        setup = launch_setup(
            argv=self.argv,
            cwd=self.spec.cwd,  # plan.spec.working_directory(): checked
            env=env,
            frontend_name=self.name,
            limits={
                name: resource.getrlimit(getattr(resource, f"RLIMIT_{name}"))
                for name in RLIMITS
                if hasattr(resource, f"RLIMIT_{name}")
            },
        )
        props = service_properties(self.units.launch(setup))  # units/launch.service
        if self.peer:  # systemd tracks a reference by the caller's bus name: none here
            props = [p for p in props if p.name != "AddRef"]
        aux = []
        if self.peer and not self.detach:  # no bus name: a service of systemd's ties us instead
            tie = self.units.tie(os.getpid())  # units/tie.service
            props.append(Prop("Wants", "as", [tie.name]))
            tie_props = [[p.name, Variant(p.signature, p.value)] for p in tie.properties]
            aux.append([tie.name, tie_props])
        body = [self.service, "fail", [[p.name, Variant(p.signature, p.value)] for p in props], aux]
        msg = self._manager_call("StartTransientUnit", "ssa(sv)a(sa(sv))", body, unix_fds=list(fds))
        if self.pending:  # interrupted before anything was created: create nothing
            raise _Interrupted(self.pending[0])
        await self._call(msg, f"create {self.service}")
        self.started = True
        for signum in self.pending:
            await self._relay(signum)
        await self._refresh()

    async def _refresh(self) -> None:
        props = await self._get_all(_UNIT)
        for key in ("ActiveState", "SubState"):
            self.state.setdefault(key, props[key].value)
        self.changed.set()

    async def _get_all(self, interface: str) -> dict[str, Variant]:
        body = await self._call(
            Message(
                destination=_SYSTEMD,
                path=self.path,
                interface=_PROPERTIES,
                member="GetAll",
                signature="s",
                body=[interface],
            ),
            f"read {self.service}",
        )
        result: dict[str, Variant] = body[0]
        return result

    async def _claim(self) -> None:
        """Own the name the service's BusName= names: from now on our end stops it."""
        assert self.bus is not None and self.name is not None
        reply = await self.bus.request_name(self.name, NameFlag.DO_NOT_QUEUE)
        if reply is not RequestNameReply.PRIMARY_OWNER:
            raise SystemdError(f"could not own {self.name} on your session bus ({reply.name})")
        self.claimed = True
        await self._hold_watcher()

    async def _hold_watcher(self) -> None:
        """A pidfd of the watcher: how we follow it if our connection goes away."""
        pid = (await self._get_all(_SERVICE))["MainPID"].value
        try:
            self.watcher = os.pidfd_open(pid) if pid else -1
        except OSError:  # it has already ended: its status comes through the bus
            pass

    async def _ended(self) -> int | None:
        """The watcher's status if its service has ended, else None."""
        if self.state.get("ActiveState") not in _ENDED:
            return None
        if self.main_exit.get("ExecMainExitTimestampMonotonic"):
            main = self.main_exit
        else:
            main = {key: value.value for key, value in (await self._get_all(_SERVICE)).items()}
        if not main["ExecMainExitTimestampMonotonic"]:
            return None  # not yet started (the start job is queued)
        status = exit_status(main["ExecMainCode"], main["ExecMainStatus"])
        if status is None:
            raise SystemdError(f"the watcher's service {self.service} ended without running")
        return status

    async def _until_ended(self) -> int:
        while True:
            await self.changed.wait()
            self.changed.clear()
            if self.lost:
                return await self._after_bus_loss()
            if self.name and not self.claimed and self.state.get("SubState") == "start":
                await self._claim()
            if self.peer and self.watcher < 0 and self.state.get("ActiveState") == "active":
                await self._hold_watcher()
            status = await self._ended()
            if status is not None:
                return status

    async def _after_bus_loss(self) -> int:
        """The bus went away: the job is being stopped; its status from its record."""
        what = (
            f"your session bus went away under job {self.spec.job} (your user manager "
            "stopped: a logout without linger, loginctl terminate-user? or systemctl --user "
            "restart dbus); systemd stops a job whose front end left the bus"
        )
        if self.peer:  # nothing stops the job: we follow the watcher to its end
            what = (
                f"your user manager closed our connection under job {self.spec.job} "
                "(systemctl --user daemon-reexec?)"
            )
        if self.watcher < 0:
            raise NoSystemdError(f"{what}, and it had not started yet", "start it again")
        ended = asyncio.get_running_loop().create_future()
        asyncio.get_running_loop().add_reader(self.watcher, ended.set_result, None)
        try:
            await ended
        finally:
            asyncio.get_running_loop().remove_reader(self.watcher)
        view = record.find(self.spec.job, Manager.USER)
        if view is None:
            raise JobLostError(
                f"{what}; the job has ended, without a record of how",
                f"see journalctl --user -u {self.spec.names.job_slice}",
            )
        print(f"gpulaunch: warning: {what}: it ended with status {view.status}", file=sys.stderr)
        return view.status

    async def _run_detached(self) -> int:
        """Start it with stderr a pipe to us; the job id once its units exist."""
        read_end, write_end = os.pipe()
        null = os.open(os.devnull, os.O_RDWR)
        try:
            await self._start((null, null, write_end))
        finally:
            os.close(write_end)
            os.close(null)
        started = asyncio.get_running_loop().create_future()
        pending = b""

        def readable() -> None:
            nonlocal pending
            chunk = os.read(read_end, 65536)
            pending += chunk
            head, marker, _ = pending.partition(STARTED)
            keep = 0 if marker or not chunk else tail_overlap(head, STARTED)
            os.write(2, head[: len(head) - keep])
            pending = head[len(head) - keep :]
            if (marker or not chunk) and not started.done():
                started.set_result(bool(marker))

        loop = asyncio.get_running_loop()
        loop.add_reader(read_end, readable)
        try:
            if await started:
                print(self.spec.job, flush=True)
                return 0
        finally:
            loop.remove_reader(read_end)
            os.close(read_end)
        return await self._until_ended()  # the start failed: the watcher's error and status


class _Interrupted(Exception):
    def __init__(self, signum: int) -> None:
        self.signum = signum
