"""The watcher as a transient service of the user manager: its name, properties and end.

Pure: what `run.py` asks systemd for, and how it reads the answer. The service's settings
come from its template, units/launch.service (`JobUnits.launch`); this module adds what
has no unit-file syntax (the front end's fds as stdin/out/err, `AddRef=`).

- `Type=dbus` with `BusName=` the front end's own name: systemd stops the
  service (SIGTERM to the watcher, SIGKILL after `TimeoutStopSec=`) as soon as
  the name goes away, which the bus daemon does when the front end's connection
  closes, however it died. Nothing of ours needs to run for that. The front end
  takes the name only once the service is in its start state (`START`): a name
  that appeared earlier is never noticed by systemd 252, which would leave the
  service activating.
- `--detach`: `Type=exec`, the job outlives the front end.
- `AddRef=yes`: the unit stays loaded while the front end is connected, so the
  front end reads the watcher's exit status (`ExecMainCode`, `ExecMainStatus`)
  after it ended; `CollectMode=inactive-or-failed` removes it once the front end
  let go.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gpulaunch.frontend.argv import pack_argv
from gpulaunch.units.codec import RLIMITS as RLIMITS
from gpulaunch.units.definitions import LaunchSetup, UnitDefinition

FRONTEND_NAME_PREFIX = "io.gpulaunch.frontend"
# Accepted by systemd in Environment= (env_name_is_valid, env_value_is_valid).
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_CLD_EXITED, _CLD_KILLED, _CLD_DUMPED = 1, 2, 3


@dataclass(frozen=True)
class Prop:
    """One property of StartTransientUnit: name, D-Bus signature, value ('h': an fd index)."""

    name: str
    signature: str
    value: object


def frontend_bus_name(pid: int) -> str:
    """The name the front end owns while its job runs (unique: one front end per pid)."""
    return f"{FRONTEND_NAME_PREFIX}.p{pid}"


def watcher_argv(python: str, argv: Sequence[str], job: str) -> list[str]:
    """The watcher's command line: the user's, told it runs under the front end, with the
    job id the front end chose (a default id has a random part)."""
    args = list(argv)
    at = args.index("start") + 1
    head = [python, "-m", "gpulaunch", *args[:at], "--frontend-child", "--job", job]
    return head + pack_argv(args[at:])  # frontend/argv.py: any bytes, through D-Bus


def environment(environ: Mapping[str, str]) -> tuple[list[str], list[str]]:
    """The front end's environment as `Environment=` entries, and the names systemd would
    refuse (not a shell name, not UTF-8, control characters): those are left out."""
    kept: list[str] = []
    dropped: list[str] = []
    for name, value in sorted(environ.items()):
        ok = _ENV_NAME.fullmatch(name) is not None and not any(
            ord(c) < 0x20 and c not in "\t\n" or c == "\x7f" or 0xD800 <= ord(c) < 0xE000
            for c in value
        )
        (kept if ok else dropped).append(f"{name}={value}" if ok else name)
    return kept, dropped


def launch_setup(
    *,
    argv: Sequence[str],
    cwd: str,
    env: Sequence[str],
    frontend_name: str | None,
    limits: Mapping[str, tuple[int, int]],
) -> LaunchSetup:
    """The variables of units/launch.service that come from the front end's process.

    `frontend_name` None: detached, the job does not depend on the front end. `limits`: the
    front end's resource limits (soft, hard; -1 infinite), for the watcher and so the ranks:
    a service otherwise gets the user manager's defaults (e.g. 1024 open files).
    """
    return LaunchSetup(
        exec_start=tuple(argv),
        working_directory=cwd,
        environment=tuple(env),
        limits=tuple((name, soft, hard) for name, (soft, hard) in limits.items()),
        bus_name=frontend_name,
    )


def service_properties(unit: UnitDefinition) -> list[Prop]:
    """The service that runs the watcher: its template's properties; fds 0, 1, 2 of the call
    are its stdin/out/err, and `AddRef=` keeps it loaded while the front end is connected."""
    return [
        *(Prop(p.name, p.signature, p.value) for p in unit.properties),
        Prop("StandardInputFileDescriptor", "h", 0),
        Prop("StandardOutputFileDescriptor", "h", 1),
        Prop("StandardErrorFileDescriptor", "h", 2),
        Prop("AddRef", "b", True),
    ]


def exit_status(code: int, status: int) -> int | None:
    """The watcher's exit as a shell reports it (128+N for signal N), from `ExecMainCode`
    and `ExecMainStatus`; None if it never ran."""
    if code == _CLD_EXITED:
        return status
    if code in (_CLD_KILLED, _CLD_DUMPED):
        return 128 + status
    return None


RELAYED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
