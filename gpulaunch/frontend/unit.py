"""The watcher as a transient service of the user manager: its name, properties and end.

Pure: what `run.py` asks systemd for, and how it reads the answer.

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
from gpulaunch.units.names import PREFIX, ROOT_SLICE, UnitNames

UNIT_PATH_PREFIX = "/org/freedesktop/systemd1/unit/"
FRONTEND_NAME_PREFIX = "io.gpulaunch.frontend"
# Accepted by systemd in Environment= (env_name_is_valid, env_value_is_valid).
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_CLD_EXITED, _CLD_KILLED, _CLD_DUMPED = 1, 2, 3
STOP_MARGIN_S = 10.0  # beyond the ranks' grace, before systemd SIGKILLs a watcher that hangs


@dataclass(frozen=True)
class Prop:
    """One property of StartTransientUnit: name, D-Bus signature, value ('h': an fd index)."""

    name: str
    signature: str
    value: object


def service_name(names: UnitNames) -> str:
    return f"{PREFIX}-{names.component}-launch.service"


def frontend_bus_name(pid: int) -> str:
    """The name the front end owns while its job runs (unique: one front end per pid)."""
    return f"{FRONTEND_NAME_PREFIX}.p{pid}"


def unit_object_path(unit: str) -> str:
    """systemd's object path of a unit (sd_bus_path_encode's escaping)."""
    out = []
    for i, byte in enumerate(unit.encode()):
        char = chr(byte)
        if char.isascii() and (char.isalpha() or (char.isdigit() and i > 0)):
            out.append(char)
        else:
            out.append(f"_{byte:02x}")
    return UNIT_PATH_PREFIX + ("".join(out) or "_")


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


def service_properties(
    *,
    names: UnitNames,
    argv: Sequence[str],
    cwd: str,
    env: Sequence[str],
    grace_sec: float,
    frontend_name: str | None,
    limits: Mapping[str, tuple[int, int]],
) -> list[Prop]:
    """The service that runs the watcher; fds 0, 1, 2 of the call are its stdin/out/err.

    `frontend_name` None: detached, the job does not depend on the front end.
    """
    props = [
        Prop("Description", "s", f"gpulaunch job {names.job}: the watcher, for its front end"),
        Prop("Slice", "s", ROOT_SLICE),
        Prop("ExecStart", "a(sasb)", [(argv[0], list(argv), False)]),
        Prop("WorkingDirectory", "s", cwd),
        Prop("Environment", "as", list(env)),
        Prop("StandardInputFileDescriptor", "h", 0),
        Prop("StandardOutputFileDescriptor", "h", 1),
        Prop("StandardErrorFileDescriptor", "h", 2),
        Prop("AddRef", "b", True),
        Prop("CollectMode", "s", "inactive-or-failed"),
        Prop("TimeoutStopUSec", "t", int((grace_sec + STOP_MARGIN_S) * 1_000_000)),
        Prop("SendSIGHUP", "b", False),
        *limit_properties(limits),
    ]
    if frontend_name is None:
        props.append(Prop("Type", "s", "exec"))
    else:
        props += [Prop("Type", "s", "dbus"), Prop("BusName", "s", frontend_name)]
    return props


# setrlimit's resources as systemd names them (Limit<NAME>= hard, Limit<NAME>Soft= soft).
RLIMITS = (
    "CPU", "FSIZE", "DATA", "STACK", "CORE", "RSS", "NOFILE", "AS", "NPROC", "MEMLOCK",
    "LOCKS", "SIGPENDING", "MSGQUEUE", "NICE", "RTPRIO", "RTTIME",
)  # fmt: skip
_INFINITY = 2**64 - 1  # RLIM_INFINITY on the bus


def limit_properties(limits: Mapping[str, tuple[int, int]]) -> list[Prop]:
    """The front end's resource limits (soft, hard; -1 infinite) for the watcher and so the
    ranks: a service otherwise gets the user manager's defaults (e.g. 1024 open files)."""
    props = []
    for name, (soft, hard) in limits.items():
        props.append(Prop(f"Limit{name}", "t", _INFINITY if hard < 0 else hard))
        props.append(Prop(f"Limit{name}Soft", "t", _INFINITY if soft < 0 else soft))
    return props


def exit_status(code: int, status: int) -> int | None:
    """The watcher's exit as a shell reports it (128+N for signal N), from `ExecMainCode`
    and `ExecMainStatus`; None if it never ran."""
    if code == _CLD_EXITED:
        return status
    if code in (_CLD_KILLED, _CLD_DUMPED):
        return 128 + status
    return None


RELAYED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
