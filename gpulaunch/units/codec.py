"""Unit-file text -> the typed D-Bus properties of `StartTransientUnit`.

The templates under `units/` are written in unit-file syntax; systemd only takes
typed `(name, variant)` pairs over D-Bus. This module does the conversion that
`systemd-run -p Key=value` does (systemd 252, `src/shared/bus-unit-util.c`,
`bus_append_unit_property_assignment`), and it checks values the way the
manager will (`src/core/dbus-unit.c`, `dbus-cgroup.c`, `dbus-scope.c`,
`dbus-kill.c`), so that a bad setting is reported here with its file and line
instead of as an anonymous D-Bus error at start time.

The syntax is systemd's (`systemd.syntax(7)`): `[Section]` headers, `Key=value`
lines, `#`/`;` comments, a trailing backslash continues a line, leading and
trailing whitespace is dropped. Where systemd expands `%` specifiers
(`systemd.unit(5)`, "Specifiers": Description=, Documentation=, dependencies,
Slice=, DeviceAllow= paths) `%%` stands for `%`; other specifiers are refused,
because a transient unit sent over D-Bus gets no specifier expansion.

The value grammars (sizes, time spans, percentages, signals, CPU sets, device
specifications, ...) are in `gpulaunch.units.values`; this module holds the
settings table (which setting, in which section, as which D-Bus property) and
the parser. Where systemd's grammar is looser than needed, a plain subset is
accepted and the rest refused with a message; everything accepted maps to
exactly the value `systemd-run` would send.

Settings that accumulate (dependencies, Documentation=, DeviceAllow=) are
merged into one property; an empty assignment resets the list. For any other
setting a later assignment replaces an earlier one, as in systemd.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from gpulaunch.errors import UnitFileError
from gpulaunch.units.values import (
    BOOLEAN_ACCEPTED,
    CPUSET_ACCEPTED,
    INFINITY,
    SIGNAL_ACCEPTED,
    TIMESPAN_ACCEPTED,
    UINT32_MAX,
    UINT64_MAX,
    USEC_PER_SEC,
    WHITESPACE,
    InvalidValue,
    check_documentation_url,
    check_unit_name,
    expand_specifiers,
    parse_boolean,
    parse_cpu_set,
    parse_decimal,
    parse_device_allow,
    parse_permyriad,
    parse_signal,
    parse_size,
    parse_timespan,
    scale_from_permyriad,
    split_words,
)

__all__ = [
    "EXEC_SETTINGS",
    "INFINITY",
    "SERVICE_SETTINGS",
    "SETTINGS",
    "Property",
    "parse_unit",
]

_UNIT_TYPES = ("scope", "slice", "service")


@dataclass(frozen=True)
class Property:
    """One D-Bus property for `StartTransientUnit`.

    `value` matches `signature` the way pystemd's `apply_signature` takes it:
    int for t/u/i, bool for b, str for s, bytes for ay, list for arrays,
    tuple for structs (so a(ss) is a list of 2-tuples).
    """

    name: str
    signature: str
    value: object


# --- the settings table ---------------------------------------------------------------------

Convert = Callable[[str], tuple[Property, ...]]
Items = Callable[[str], list[object]]

_CGROUP = frozenset({"Scope", "Slice", "Service"})
_SCOPE = frozenset({"Scope", "Service"})  # units with processes: a scope, a service
_SERVICE = frozenset({"Service"})
_UNIT = frozenset({"Unit"})


@dataclass(frozen=True)
class _Setting:
    """How one `Key=` is converted. `items` marks an accumulating list setting."""

    key: str
    sections: frozenset[str]
    accepted: str
    convert: Convert | None = None
    items: Items | None = None
    dbus_name: str = ""
    signature: str = ""
    specifiers: bool = False
    manual: str = ""


def _one(name: str, signature: str, parse: Callable[[str], object]) -> Convert:
    def convert(value: str) -> tuple[Property, ...]:
        return (Property(name, signature, parse(value)),)

    return convert


def _enum(choices: tuple[str, ...]) -> Callable[[str], object]:
    def parse(value: str) -> object:
        if value not in choices:
            raise InvalidValue(f"unknown value {value!r}")
        return value

    return parse


def _nonempty(parse: Callable[[str], object]) -> Callable[[str], object]:
    def wrapped(value: str) -> object:
        if not value:
            raise InvalidValue("empty value")
        return parse(value)

    return wrapped


def _memory(key: str) -> Convert:
    """bus_append_cgroup_property(), MemoryMax= and friends; server minimums from dbus-cgroup.c."""
    protection = key in ("MemoryMin", "MemoryLow", "DefaultMemoryMin", "DefaultMemoryLow")
    may_be_zero = protection or key == "MemorySwapMax"

    def convert(value: str) -> tuple[Property, ...]:
        if value == "infinity":
            return (Property(key, "t", INFINITY),)
        if value == "":
            return (Property(key, "t", 0 if protection else INFINITY),)
        permyriad = parse_permyriad(value)
        if permyriad is not None:
            if permyriad == 0 and not may_be_zero:
                raise InvalidValue("0% would leave no memory at all")
            # The server scales this fraction of 2**32-1 by physical memory.
            return (Property(key + "Scale", "u", scale_from_permyriad(permyriad)),)
        size = parse_size(value)
        if size == 0 and not may_be_zero:
            raise InvalidValue("0 would leave no memory at all")
        return (Property(key, "t", size),)

    return convert


def _tasks_max(value: str) -> tuple[Property, ...]:
    if value in ("infinity", ""):
        return (Property("TasksMax", "t", INFINITY),)
    permyriad = parse_permyriad(value)
    if permyriad is not None:
        scaled = scale_from_permyriad(permyriad)
        # bus_cgroup_set_tasks_max_scale() (dbus-cgroup.c) refuses 0 and 2**32-1, i.e. 100%.
        if not 1 <= scaled < UINT32_MAX:
            raise InvalidValue("systemd accepts percentages above 0% and below 100% here")
        return (Property("TasksMaxScale", "u", scaled),)
    tasks = parse_decimal(value)
    if not 1 <= tasks <= UINT64_MAX:
        raise InvalidValue(f"{tasks} is out of range")
    return (Property("TasksMax", "t", tasks),)


def _weight(name: str, *, idle: bool) -> Convert:
    """cg_weight_parse()/cg_cpu_weight_parse() (src/shared/cgroup-setup.c)."""

    def parse(value: str) -> object:
        if value == "":
            return UINT64_MAX  # CGROUP_WEIGHT_INVALID: the default
        if idle and value == "idle":
            return 0  # CGROUP_WEIGHT_IDLE
        weight = parse_decimal(value)
        if not 1 <= weight <= 10000:
            raise InvalidValue(f"{weight} is out of range")
        return weight

    return _one(name, "t", parse)


def _cpu_quota(value: str) -> tuple[Property, ...]:
    if value == "":
        return (Property("CPUQuotaPerSecUSec", "t", INFINITY),)
    permyriad = parse_permyriad(value, bounded=False)
    if permyriad is None:
        raise InvalidValue("not a percentage")
    if permyriad == 0:
        raise InvalidValue("CPU quota too small")
    return (Property("CPUQuotaPerSecUSec", "t", permyriad * USEC_PER_SEC // 10000),)


def _timespan_or_infinity(value: str) -> object:
    return INFINITY if value.strip(WHITESPACE) == "" else parse_timespan(value)


def _oom_limit(value: str) -> object:
    permyriad = parse_permyriad(value)
    if permyriad is None:
        raise InvalidValue("not a percentage")
    return scale_from_permyriad(permyriad)


_CONTROLLERS = (
    "cpu cpuacct cpuset io blkio memory devices pids bpf-firewall bpf-devices bpf-foreign "
    "bpf-socket-bind bpf-restrict-network-interfaces"
).split()


def _delegate(value: str) -> tuple[Property, ...]:
    """A boolean, or the controllers to delegate (bus_append_cgroup_property(), Delegate=)."""
    try:
        return (Property("Delegate", "b", parse_boolean(value)),)
    except InvalidValue:
        pass
    controllers = split_words(value, unquote=True, retain_escape=False)
    for controller in controllers:
        if controller not in _CONTROLLERS:
            raise InvalidValue(
                f"{controller!r} is neither a boolean nor a cgroup controller"
            ) from None
    return (Property("DelegateControllers", "as", controllers),)


def _unit_names(value: str) -> list[object]:
    # config_parse_unit_deps() splits without unquoting and keeps backslashes (\x2d escapes).
    return [check_unit_name(word) for word in split_words(value, unquote=False, retain_escape=True)]


def _documentation(value: str) -> list[object]:
    words = split_words(value, unquote=True, retain_escape=True)
    return [check_documentation_url(word) for word in words]


_SIZE_ACCEPTED = (
    "use bytes with K, M, G, T, P or E suffix (base 1024), a percentage of physical memory, "
    "or infinity"
)
_DEPENDENCIES = (
    "Requires Requisite Wants BindsTo PartOf Upholds Conflicts Before After OnSuccess OnFailure "
    "PropagatesReloadTo ReloadPropagatedFrom PropagatesStopTo StopPropagatedFrom JoinsNamespaceOf"
).split()


# --- service values: ExecStart= and Environment= words, Limit*= (units/*.service) ---------


def exec_words(text: str) -> list[str]:
    """The words of ExecStart= or Environment=: extract_first_word() with EXTRACT_UNQUOTE and
    EXTRACT_CUNESCAPE: '...' and "..." quote, and a backslash starts a C escape (\\n, \\t,
    \\xNN, \\", \\\\, ...) inside quotes and out."""
    return split_words(text, unquote=True, retain_escape=False, cunescape=True)


RLIMIT_ACCEPTED = "use SOFT:HARD or one value for both, each a plain number or infinity"


def parse_rlimit(text: str) -> tuple[int, int]:
    """`Limit*=` as (soft, hard): raw numbers (the unit setrlimit() takes) or infinity.

    systemd also reads sizes and time spans with units here; a plain subset is enough for
    gpulaunch's templates, which copy the caller's own limits.
    """

    def one(value: str) -> int:
        if value == "infinity":
            return UINT64_MAX
        return parse_decimal(value, "a number or infinity")

    soft, colon, hard = text.partition(":")
    if not colon:
        return one(text), one(text)
    low, high = one(soft), one(hard)
    if low > high:
        raise InvalidValue(f"the soft limit {soft} is above the hard limit {hard}")
    return low, high


_UNIT5, _SCOPE5, _KILL5 = "systemd.unit(5)", "systemd.scope(5)", "systemd.kill(5)"
_RC5 = "systemd.resource-control(5)"
_SERVICE5, _EXEC5 = "systemd.service(5)", "systemd.exec(5)"


def _exec_start(value: str) -> list[object]:
    """One command of ExecStart=: (path, argv, ignore failure), as a(sasb) takes it."""
    words = exec_words(value)
    if not words:
        raise InvalidValue("no command")
    first = words[0]
    ignore = first.startswith("-")
    path = first[1:] if ignore else first
    if path[:1] in ("@", ":", "+", "!"):
        raise InvalidValue(f"the prefix {path[0]!r} is not supported", "use an absolute path")
    if not path.startswith("/"):
        raise InvalidValue(f"{path!r} is not an absolute path", "use an absolute path")
    return [(path, [path, *words[1:]], ignore)]


def _environment(value: str) -> list[object]:
    """Environment=: NAME=VALUE words, quoted and C-escaped as systemd reads them."""
    out: list[object] = []
    for word in exec_words(value):
        name, eq, _ = word.partition("=")
        if not eq or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            raise InvalidValue(f"{word!r} is not NAME=VALUE")
        out.append(word)
    return out


def _working_directory(value: str) -> tuple[Property, ...]:
    if not value.startswith("/"):
        raise InvalidValue(f"{value!r} is not an absolute path", "use an absolute path")
    return (Property("WorkingDirectory", "s", value),)


def _bus_name(value: str) -> object:
    if not re.fullmatch(r"[A-Za-z_-][A-Za-z0-9_-]*(\.[A-Za-z_-][A-Za-z0-9_-]*)+", value):
        raise InvalidValue(f"{value!r} is not a well-known D-Bus name")
    return value


def _limit(key: str) -> Convert:
    """LimitX=SOFT:HARD or LimitX=BOTH: LimitX (hard) and LimitXSoft (soft), raw numbers."""

    def convert(value: str) -> tuple[Property, ...]:
        soft, hard = parse_rlimit(value)
        return (Property(key, "t", hard), Property(key + "Soft", "t", soft))

    return convert


RLIMITS = (
    "CPU", "FSIZE", "DATA", "STACK", "CORE", "RSS", "NOFILE", "AS", "NPROC", "MEMLOCK",
    "LOCKS", "SIGPENDING", "MSGQUEUE", "NICE", "RTPRIO", "RTTIME",
)  # fmt: skip
_OUTPUTS = ("inherit", "null", "tty", "journal", "kmsg", "journal+console", "kmsg+console")


def _scalar(
    key: str,
    sections: frozenset[str],
    manual: str,
    accepted: str,
    convert: Convert,
    *,
    specifiers: bool = False,
) -> _Setting:
    return _Setting(key, sections, accepted, convert, specifiers=specifiers, manual=manual)


def _listing(
    key: str, sections: frozenset[str], manual: str, accepted: str, signature: str, items: Items
) -> _Setting:
    """An accumulating setting; all of them expand specifiers in systemd's unit-file parser."""
    return _Setting(key, sections, accepted, None, items, key, signature, True, manual)


def _booleans(sections: frozenset[str], manual: str, *keys: str) -> list[_Setting]:
    return [
        _scalar(key, sections, manual, BOOLEAN_ACCEPTED, _one(key, "b", parse_boolean))
        for key in keys
    ]


def _choices(sections: frozenset[str], manual: str, key: str, *choices: str) -> _Setting:
    accepted = "use " + ", ".join(choices[:-1]) + " or " + choices[-1]
    return _scalar(key, sections, manual, accepted, _one(key, "s", _enum(choices)))


def _timespans(sections: frozenset[str], manual: str, *keys: str) -> list[_Setting]:
    """Settings named ...Sec; the D-Bus property is ...USec (bus_append_parse_sec_rename())."""
    return [
        _scalar(
            key, sections, manual, TIMESPAN_ACCEPTED, _one(key[:-3] + "USec", "t", parse_timespan)
        )
        for key in keys
    ]


def _slice_name(value: str) -> object:
    return check_unit_name(value, suffix="slice")


# fmt: off
_TABLE: list[_Setting] = [
    # [Unit]: src/core/dbus-unit.c, bus_unit_set_transient_property() and live properties.
    _scalar("Description", _UNIT, _UNIT5, "any one-line text", _one("Description", "s", str),
            specifiers=True),
    _listing("Documentation", _UNIT, _UNIT5, "use http://, https://, file:/, info: or man: URLs",
             "as", _documentation),
    *(_listing(dep, _UNIT, _UNIT5, "use unit names separated by spaces", "as", _unit_names)
      for dep in _DEPENDENCIES),
    _choices(_UNIT, _UNIT5, "CollectMode", "inactive", "inactive-or-failed"),
    *_booleans(_UNIT, _UNIT5, "StopWhenUnneeded", "DefaultDependencies", "RefuseManualStart",
               "RefuseManualStop", "IgnoreOnIsolate"),
    *_timespans(_UNIT, _UNIT5, "JobRunningTimeoutSec"),

    # [Scope] only: src/core/dbus-scope.c, dbus-kill.c; Delegate= is refused for slices.
    # [Service] only (src/core/dbus-service.c, dbus-execute.c): what gpulaunch's own services
    # use (units/anchor.service, units/launch.service) and little more.
    _listing("ExecStart", _SERVICE, _SERVICE5, "use an absolute path, then arguments (quote "
             "with \"...\", C escapes such as \\n inside)", "a(sasb)", _exec_start),
    _listing("ExecStopPost", _SERVICE, _SERVICE5, "use an absolute path, then arguments (quote "
             "with \"...\", C escapes such as \\n inside)", "a(sasb)", _exec_start),
    _listing("Environment", _SERVICE, _EXEC5, "use NAME=VALUE words (quote with \"...\")", "as",
             _environment),
    _scalar("WorkingDirectory", _SERVICE, _EXEC5, "use an absolute path", _working_directory,
            specifiers=True),
    _choices(_SERVICE, _EXEC5, "StandardInput", "null", "tty", "tty-force", "tty-fail"),
    _choices(_SERVICE, _EXEC5, "StandardOutput", *_OUTPUTS),
    _choices(_SERVICE, _EXEC5, "StandardError", *_OUTPUTS),
    _choices(_SERVICE, _SERVICE5, "Type", "simple", "exec", "forking", "oneshot", "dbus",
             "notify", "idle"),
    _scalar("BusName", _SERVICE, _SERVICE5, "use a well-known D-Bus name",
            _one("BusName", "s", _bus_name)),
    *(_scalar(f"Limit{name}", _SERVICE, _EXEC5, RLIMIT_ACCEPTED, _limit(f"Limit{name}"))
      for name in RLIMITS),

    _scalar("Slice", _SCOPE, _SCOPE5, "use the name of a slice unit",
            _one("Slice", "s", _slice_name), specifiers=True),
    *_timespans(_SCOPE, _SCOPE5, "TimeoutStopSec", "RuntimeMaxSec", "RuntimeRandomizedExtraSec"),
    _choices(_SCOPE, _SCOPE5, "OOMPolicy", "continue", "stop", "kill"),
    _choices(_SCOPE, _KILL5, "KillMode", "control-group", "mixed", "process", "none"),
    *_booleans(_SCOPE, _KILL5, "SendSIGKILL", "SendSIGHUP"),
    *(_scalar(key, _SCOPE, _KILL5, SIGNAL_ACCEPTED, _one(key, "i", parse_signal))
      for key in ("KillSignal", "RestartKillSignal", "FinalKillSignal", "WatchdogSignal")),
    _scalar("Delegate", _SCOPE, _RC5, "use a boolean or a list of cgroup controllers (cpu, io, "
            "memory, pids, ...)", _delegate),

    # [Scope] and [Slice]: resource control, src/core/dbus-cgroup.c.
    *_booleans(_CGROUP, _RC5, "CPUAccounting", "MemoryAccounting", "IOAccounting",
               "TasksAccounting", "IPAccounting"),
    *(_scalar(key, _CGROUP, _RC5, _SIZE_ACCEPTED, _memory(key))
      for key in ("MemoryMin", "MemoryLow", "MemoryHigh", "MemoryMax", "MemorySwapMax",
                  "DefaultMemoryMin", "DefaultMemoryLow")),
    _scalar("TasksMax", _CGROUP, _RC5, "use a number, a percentage of the system's limit, or "
            "infinity", _tasks_max),
    *(_scalar(key, _CGROUP, _RC5, "use a number from 1 to 10000, or idle", _weight(key, idle=True))
      for key in ("CPUWeight", "StartupCPUWeight")),
    *(_scalar(key, _CGROUP, _RC5, "use a number from 1 to 10000", _weight(key, idle=False))
      for key in ("IOWeight", "StartupIOWeight")),
    _scalar("CPUQuota", _CGROUP, _RC5, "use a percentage of one CPU above 0%, e.g. 150%",
            _cpu_quota),
    _scalar("CPUQuotaPeriodSec", _CGROUP, _RC5, TIMESPAN_ACCEPTED,
            _one("CPUQuotaPeriodUSec", "t", _timespan_or_infinity)),
    *(_scalar(key, _CGROUP, _RC5, CPUSET_ACCEPTED, _one(key, "ay", parse_cpu_set))
      for key in ("AllowedCPUs", "StartupAllowedCPUs", "AllowedMemoryNodes",
                  "StartupAllowedMemoryNodes")),
    _choices(_CGROUP, _RC5, "DevicePolicy", "auto", "closed", "strict"),
    _listing("DeviceAllow", _CGROUP, _RC5, "use a device path, then optional rights r, w, m",
             "a(ss)", parse_device_allow),
    _choices(_CGROUP, _RC5, "ManagedOOMSwap", "auto", "kill"),
    _choices(_CGROUP, _RC5, "ManagedOOMMemoryPressure", "auto", "kill"),
    _scalar("ManagedOOMMemoryPressureLimit", _CGROUP, _RC5, "use a percentage from 0% to 100%",
            _one("ManagedOOMMemoryPressureLimit", "u", _nonempty(_oom_limit))),
    _choices(_CGROUP, _RC5, "ManagedOOMPreference", "none", "avoid", "omit"),
]
# fmt: on
SETTINGS: dict[str, _Setting] = {setting.key: setting for setting in _TABLE}

# Exec settings (EXEC_CONTEXT_CONFIG_ITEMS, src/core/load-fragment-gperf.gperf.in): only units
# that start processes have them. Scopes and slices refuse them ("Cannot set property").
EXEC_SETTINGS = frozenset(
    """AmbientCapabilities AppArmorProfile BindPaths BindReadOnlyPaths CPUAffinity
    CPUSchedulingPolicy CPUSchedulingPriority CPUSchedulingResetOnFork CacheDirectory
    CacheDirectoryMode CapabilityBoundingSet ConfigurationDirectory ConfigurationDirectoryMode
    CoredumpFilter DynamicUser Environment EnvironmentFile ExecPaths ExecSearchPath
    ExtensionDirectories ExtensionImages Group IOSchedulingClass IOSchedulingPriority
    IPCNamespacePath IgnoreSIGPIPE InaccessiblePaths KeyringMode LimitAS LimitCORE LimitCPU
    LimitDATA LimitFSIZE LimitLOCKS LimitMEMLOCK LimitMSGQUEUE LimitNICE LimitNOFILE LimitNPROC
    LimitRSS LimitRTPRIO LimitRTTIME LimitSIGPENDING LimitSTACK LoadCredential
    LoadCredentialEncrypted LockPersonality LogExtraFields LogLevelMax LogNamespace
    LogRateLimitBurst LogRateLimitIntervalSec LogsDirectory LogsDirectoryMode
    MemoryDenyWriteExecute MountAPIVFS MountFlags MountImages NUMAMask NUMAPolicy
    NetworkNamespacePath Nice NoExecPaths NoNewPrivileges OOMScoreAdjust PAMName PassEnvironment
    Personality PrivateDevices PrivateIPC PrivateMounts PrivateNetwork PrivateTmp PrivateUsers
    ProcSubset ProtectClock ProtectControlGroups ProtectHome ProtectHostname ProtectKernelLogs
    ProtectKernelModules ProtectKernelTunables ProtectProc ProtectSystem ReadOnlyPaths
    ReadWritePaths RemoveIPC RestrictAddressFamilies RestrictFileSystems RestrictNamespaces
    RestrictRealtime RestrictSUIDSGID RootDirectory RootHash RootHashSignature RootImage
    RootImageOptions RootVerity RuntimeDirectory RuntimeDirectoryMode RuntimeDirectoryPreserve
    SELinuxContext SecureBits SetCredential SetCredentialEncrypted SmackProcessLabel
    StandardError StandardInput StandardInputData StandardInputText StandardOutput
    StateDirectory StateDirectoryMode SupplementaryGroups SyslogFacility SyslogIdentifier
    SyslogLevel SyslogLevelPrefix SystemCallArchitectures SystemCallErrorNumber
    SystemCallFilter SystemCallLog TTYColumns TTYPath TTYReset TTYRows TTYVHangup
    TTYVTDisallocate TemporaryFileSystem TimeoutCleanSec TimerSlackNSec UMask UnsetEnvironment
    User UtmpIdentifier UtmpMode WorkingDirectory""".split()
)
# Why an exec setting cannot work here, where there is more to say than "services only".
_EXEC_REASONS = {
    "LogRateLimitIntervalSec": "see journald.conf RateLimitIntervalSec= for scopes",
    "LogRateLimitBurst": "see journald.conf RateLimitBurst= for scopes",
    "LogLevelMax": "filter with journalctl -p instead",
    "LogExtraFields": "journald attributes rank lines by their unit already",
    "Environment": "gpulaunch gives every rank its environment itself",
    "UnsetEnvironment": "gpulaunch gives every rank its environment itself",
    "PassEnvironment": "gpulaunch gives every rank its environment itself",
    "EnvironmentFile": "gpulaunch gives every rank its environment itself",
    "StandardOutput": "gpulaunch connects rank output to the journal itself",
    "StandardError": "gpulaunch connects rank output to the journal itself",
    "WorkingDirectory": "ranks start in gpulaunch's working directory",
}
SERVICE_SETTINGS = frozenset(
    """BusName ExecCondition ExecReload ExecStart ExecStartPost ExecStartPre ExecStop
    ExecStopPost ExitType FileDescriptorStoreMax GuessMainPID NonBlocking NotifyAccess PIDFile
    PermissionsStartOnly RemainAfterExit Restart RestartForceExitStatus RestartPreventExitStatus
    RestartSec RootDirectoryStartOnly Sockets SuccessExitStatus TimeoutAbortSec TimeoutSec
    TimeoutStartFailureMode TimeoutStartSec TimeoutStopFailureMode Type WatchdogSec""".split()
)
# Real systemd settings this codec does not convert (yet), and ones systemd itself refuses.
_UNSUPPORTED = {
    key: "not supported by gpulaunch's unit codec"
    for key in """IODeviceWeight IOReadBandwidthMax IOWriteBandwidthMax IOReadIOPSMax
    IOWriteIOPSMax IODeviceLatencyTargetSec IPAddressAllow IPAddressDeny IPIngressFilterPath
    IPEgressFilterPath BPFProgram SocketBindAllow SocketBindDeny RestrictNetworkInterfaces
    DisableControllers RequiresMountsFor SourcePath AllowIsolate OnSuccessJobMode
    OnFailureJobMode JobTimeoutAction JobTimeoutRebootArgument StartLimitIntervalSec
    StartLimitBurst StartLimitAction FailureAction SuccessAction FailureActionExitStatus
    SuccessActionExitStatus RebootArgument""".split()
}
_UNSUPPORTED.update(
    {
        "JobTimeoutSec": (
            "systemd 252 refuses JobTimeoutUSec in StartTransientUnit (src/core/dbus-unit.c "
            "handles it but returns 0, so it fails with 'Cannot set property'); "
            "use JobRunningTimeoutSec="
        ),
        "CPUShares": "deprecated (cgroup v1); use CPUWeight=",
        "StartupCPUShares": "deprecated (cgroup v1); use StartupCPUWeight=",
        "MemoryLimit": "deprecated (cgroup v1); use MemoryMax=",
        "BlockIOAccounting": "deprecated (cgroup v1); use IOAccounting=",
        "BlockIOWeight": "deprecated (cgroup v1); use IOWeight=",
        "StartupBlockIOWeight": "deprecated (cgroup v1); use StartupIOWeight=",
        "BlockIODeviceWeight": "deprecated (cgroup v1) and not supported",
        "BlockIOReadBandwidth": "deprecated (cgroup v1) and not supported",
        "BlockIOWriteBandwidth": "deprecated (cgroup v1) and not supported",
        "NetClass": "removed from systemd",
    }
)


# --- the parser -----------------------------------------------------------------------------


def _logical_lines(text: str) -> Iterator[tuple[int, str]]:
    """(first line number, text) of each logical line: comments dropped, continuations joined.

    As config_parse() does (src/shared/conf-parser.c): a comment line is skipped even inside
    a continuation; a line ending in an unescaped backslash continues, the backslash becoming
    a space.
    """
    pending: str | None = None
    start = 0
    for number, raw in enumerate(re.split(r"\r\n|\r|\n", text), 1):
        if raw.lstrip(WHITESPACE)[:1] in ("#", ";"):
            continue
        if pending is None:
            start = number
        current = raw if pending is None else pending + raw
        escaped = False
        for char in current:
            escaped = not escaped and char == "\\"
        if escaped:
            pending = current[:-1] + " "
            continue
        pending = None
        yield start, current
    if pending is not None:
        yield start, pending


class _Result:
    """Properties in order; a reassigned setting moves to the end, a list keeps its place."""

    def __init__(self) -> None:
        self._scalars: dict[str, tuple[Property, ...]] = {}
        self._lists: dict[str, list[object]] = {}
        self._order: list[str] = []

    def set(self, key: str, properties: tuple[Property, ...]) -> None:
        if key in self._scalars:
            self._order.remove(key)
        self._scalars[key] = properties
        self._order.append(key)

    def extend(self, key: str, items: list[object] | None) -> None:
        if key not in self._lists:
            self._lists[key] = []
            self._order.append(key)
        if items is None:
            self._lists[key].clear()
        else:
            self._lists[key].extend(items)

    def properties(self) -> tuple[Property, ...]:
        out: list[Property] = []
        for key in self._order:
            if key in self._scalars:
                out.extend(self._scalars[key])
            else:
                setting = SETTINGS[key]
                out.append(Property(setting.dbus_name, setting.signature, list(self._lists[key])))
        return tuple(out)


def parse_unit(text: str, unit_type: str, source: str) -> tuple[Property, ...]:
    """Convert unit-file text for a transient `unit_type` ("scope", "slice" or "service")
    into properties.

    `source` names the text in error messages ("units/rank.scope:12: ..."). Raises
    `UnitFileError` for anything systemd would refuse or ignore: unknown settings, settings in
    the wrong section or not valid for this unit type, exec settings, bad values.
    """
    if unit_type not in _UNIT_TYPES:
        raise ValueError(f"unit type must be one of {_UNIT_TYPES}, not {unit_type!r}")
    type_section = unit_type.capitalize()
    result = _Result()
    section: str | None = None
    for line, raw in _logical_lines(text):
        fail = _Failure(source, line)
        stripped = raw.strip(WHITESPACE)
        if not stripped:
            continue
        if stripped.startswith("["):
            name = stripped[1:-1] if stripped.endswith("]") else None
            if name in ("Unit", type_section):
                section = name
                continue
            accepted = f"use [Unit] and [{type_section}]"
            if name in ("Scope", "Slice", "Service"):
                raise fail(
                    f"[{name}] is for {name.lower()} units, this is a {unit_type}; {accepted}"
                )
            if name is None:
                raise fail(f"bad section header {stripped!r}; {accepted}")
            raise fail(f"unknown section [{name}]; {accepted}")
        if "=" not in stripped:
            raise fail(f"{stripped!r} is not a setting; expected Key=value")
        key, _, value = stripped.partition("=")
        key, value = key.strip(WHITESPACE), value.strip(WHITESPACE)
        if not key:
            raise fail(f"{stripped!r} has no setting name before '='")
        if section is None:
            raise fail(
                f"{key}= is outside any section; put it under [Unit] or [{type_section}]",
                key=key,
            )
        setting = _lookup(key, section, unit_type, type_section, fail)
        try:
            expanded = expand_specifiers(value) if setting.specifiers else value
            if setting.items is not None:
                result.extend(key, setting.items(expanded) if expanded else None)
            else:
                assert setting.convert is not None
                result.set(key, setting.convert(expanded))
        except InvalidValue as exc:
            accepted = exc.accepted or setting.accepted
            problem = f"{key}={value}: {exc.problem}; {accepted}"
            raise fail(problem, f"see {setting.manual}", key) from None
    return result.properties()


class _Failure:
    """Makes the `UnitFileError` for one line of one source."""

    def __init__(self, source: str, line: int) -> None:
        self.source = source
        self.line = line

    def __call__(
        self, problem: str, hint: str | None = None, key: str | None = None
    ) -> UnitFileError:
        return UnitFileError(
            f"{self.source}:{self.line}: {problem}",
            hint,
            source=self.source,
            line=self.line,
            setting=key,
        )


def _lookup(key: str, section: str, unit_type: str, type_section: str, fail: _Failure) -> _Setting:
    """The table entry for `key` in `section`, or the reason it cannot be used there."""
    setting = SETTINGS.get(key)
    if unit_type != "service" and (key in EXEC_SETTINGS or key in SERVICE_SETTINGS):
        setting = None  # the reasons below say why a scope or a slice cannot have it
    if setting is not None:
        if section in setting.sections:
            return setting
        if type_section not in setting.sections and "Unit" not in setting.sections:
            types = sorted(s.lower() for s in setting.sections)
            raise fail(
                f"{key}= is not valid for a {unit_type} unit; only {' and '.join(types)} units "
                f"accept it (in {' or '.join(f'[{s}]' for s in sorted(setting.sections))})",
                key=key,
            )
        right = "Unit" if "Unit" in setting.sections else type_section
        raise fail(f"{key}= belongs in [{right}], not [{section}]", key=key)
    if key in ("User", "Group") and unit_type == "scope":
        raise fail(
            f"{key}= on a scope only hands a delegated cgroup to that user or group; it does "
            "not run the ranks as them, and gpulaunch does not support it",
            key=key,
        )
    if unit_type == "service" and (key in EXEC_SETTINGS or key in SERVICE_SETTINGS):
        raise fail(f"{key}= is not supported by gpulaunch's unit codec (yet)", key=key)
    if key in EXEC_SETTINGS:
        reason = _EXEC_REASONS.get(key)
        raise fail(
            f"{key}= is an exec setting; systemd refuses it on {unit_type} units "
            f"(only services accept it{'; ' + reason if reason else ''})",
            key=key,
        )
    if key in SERVICE_SETTINGS:
        raise fail(
            f"{key}= is a service setting; systemd refuses it on {unit_type} units "
            f"(a {unit_type} runs no command of its own)",
            key=key,
        )
    if key in _UNSUPPORTED:
        raise fail(f"{key}=: {_UNSUPPORTED[key]}", key=key)
    here = sorted(k for k, s in SETTINGS.items() if section in s.sections)
    close = difflib.get_close_matches(key, here, n=1)
    guess = f" (did you mean {close[0]}=?)" if close else ""
    raise fail(
        f"unknown setting {key}= for a {unit_type}{guess}; accepted in [{section}]: "
        + ", ".join(here),
        key=key,
    )
