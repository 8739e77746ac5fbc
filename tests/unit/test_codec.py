"""The unit-file codec: every supported setting with good and bad values.

Expected values are what systemd 252's `systemd-run -p Key=value` sends
(src/shared/bus-unit-util.c); comments name the conversion where it surprises.
"""

from __future__ import annotations

import signal

import pytest

from gpulaunch.errors import TemplateError, UnitFileError
from gpulaunch.units.codec import INFINITY, Property, parse_unit

SOURCE = "units/test.scope"
UINT32_MAX = 2**32 - 1
HALF = 2147483648  # UINT32_SCALE_FROM_PERMYRIAD(5000): rounds up
RTMIN, RTMAX = int(signal.SIGRTMIN), int(signal.SIGRTMAX)  # 34 and 64 with glibc


def parse(section: str, *lines: str, unit_type: str = "scope") -> tuple[Property, ...]:
    return parse_unit(f"[{section}]\n" + "\n".join(lines) + "\n", unit_type, SOURCE)


def error(section: str, *lines: str, unit_type: str = "scope") -> UnitFileError:
    with pytest.raises(UnitFileError) as info:
        parse(section, *lines, unit_type=unit_type)
    return info.value


def P(name: str, signature: str, value: object) -> Property:  # noqa: N802 - reads like a table
    return Property(name, signature, value)


# (section, line, expected properties); cgroup settings are checked on scopes and slices.
GOOD: list[tuple[str, str, tuple[Property, ...]]] = [
    # [Unit]
    ("Unit", "Description=rank 0 (GPU 1)", (P("Description", "s", "rank 0 (GPU 1)"),)),
    ("Unit", "Description=", (P("Description", "s", ""),)),
    ("Unit", "Description=50%% done", (P("Description", "s", "50% done"),)),
    ("Unit", "Description=ünï \\n literal", (P("Description", "s", "ünï \\n literal"),)),
    (
        "Unit",
        "Documentation=man:gpulaunch(1) https://example.org/x file:/usr/share/doc",
        (
            P(
                "Documentation",
                "as",
                ["man:gpulaunch(1)", "https://example.org/x", "file:/usr/share/doc"],
            ),
        ),
    ),
    ("Unit", "Documentation='info:a b'", (P("Documentation", "as", ["info:a b"]),)),
    (
        "Unit",
        "BindsTo=gpulaunch-j-watcher.scope  other.service",
        (P("BindsTo", "as", ["gpulaunch-j-watcher.scope", "other.service"]),),
    ),
    # \x2d escapes stay as written: they are part of the unit name
    ("Unit", "After=gpulaunch-a\\x2db.slice", (P("After", "as", ["gpulaunch-a\\x2db.slice"]),)),
    ("Unit", "Wants=getty@tty1.service", (P("Wants", "as", ["getty@tty1.service"]),)),
    ("Unit", "Requires=a.service", (P("Requires", "as", ["a.service"]),)),
    ("Unit", "Before=a.service", (P("Before", "as", ["a.service"]),)),
    ("Unit", "PartOf=a.service", (P("PartOf", "as", ["a.service"]),)),
    ("Unit", "Conflicts=a.service", (P("Conflicts", "as", ["a.service"]),)),
    ("Unit", "PropagatesStopTo=j.slice", (P("PropagatesStopTo", "as", ["j.slice"]),)),
    ("Unit", "StopPropagatedFrom=w.scope", (P("StopPropagatedFrom", "as", ["w.scope"]),)),
    ("Unit", "OnFailure=report.service", (P("OnFailure", "as", ["report.service"]),)),
    ("Unit", "CollectMode=inactive", (P("CollectMode", "s", "inactive"),)),
    ("Unit", "CollectMode=inactive-or-failed", (P("CollectMode", "s", "inactive-or-failed"),)),
    ("Unit", "StopWhenUnneeded=yes", (P("StopWhenUnneeded", "b", True),)),
    ("Unit", "DefaultDependencies=off", (P("DefaultDependencies", "b", False),)),
    ("Unit", "JobRunningTimeoutSec=5min", (P("JobRunningTimeoutUSec", "t", 300_000_000),)),
    # [Scope]
    ("Scope", "Slice=gpulaunch-j-ranks.slice", (P("Slice", "s", "gpulaunch-j-ranks.slice"),)),
    ("Scope", "TimeoutStopSec=30", (P("TimeoutStopUSec", "t", 30_000_000),)),
    ("Scope", "RuntimeMaxSec=infinity", (P("RuntimeMaxUSec", "t", INFINITY),)),
    ("Scope", "RuntimeRandomizedExtraSec=1s", (P("RuntimeRandomizedExtraUSec", "t", 10**6),)),
    ("Scope", "SendSIGKILL=yes", (P("SendSIGKILL", "b", True),)),
    ("Scope", "SendSIGHUP=0", (P("SendSIGHUP", "b", False),)),
    ("Scope", "KillMode=control-group", (P("KillMode", "s", "control-group"),)),
    ("Scope", "KillMode=mixed", (P("KillMode", "s", "mixed"),)),
    ("Scope", "KillMode=process", (P("KillMode", "s", "process"),)),
    ("Scope", "KillMode=none", (P("KillMode", "s", "none"),)),
    ("Scope", "KillSignal=SIGTERM", (P("KillSignal", "i", 15),)),
    ("Scope", "KillSignal=INT", (P("KillSignal", "i", 2),)),
    ("Scope", "FinalKillSignal=9", (P("FinalKillSignal", "i", 9),)),
    ("Scope", "RestartKillSignal=SIGRTMIN", (P("RestartKillSignal", "i", RTMIN),)),
    ("Scope", "WatchdogSignal=RTMIN+2", (P("WatchdogSignal", "i", RTMIN + 2),)),
    ("Scope", "KillSignal=SIGRTMAX-1", (P("KillSignal", "i", RTMAX - 1),)),
    ("Scope", "KillSignal=64", (P("KillSignal", "i", 64),)),
    ("Scope", "OOMPolicy=continue", (P("OOMPolicy", "s", "continue"),)),
    ("Scope", "OOMPolicy=stop", (P("OOMPolicy", "s", "stop"),)),
    ("Scope", "OOMPolicy=kill", (P("OOMPolicy", "s", "kill"),)),
    ("Scope", "Delegate=yes", (P("Delegate", "b", True),)),
    ("Scope", "Delegate=false", (P("Delegate", "b", False),)),
    # not a boolean: the controllers to delegate, as systemd-run sends it
    ("Scope", "Delegate=cpu memory", (P("DelegateControllers", "as", ["cpu", "memory"]),)),
]

CGROUP_GOOD: list[tuple[str, tuple[Property, ...]]] = [
    ("MemoryMax=16G", (P("MemoryMax", "t", 16 * 2**30),)),
    ("MemoryMax=1", (P("MemoryMax", "t", 1),)),
    ("MemoryMax=512K", (P("MemoryMax", "t", 512 * 1024),)),
    ("MemoryMax=1.5G", (P("MemoryMax", "t", 3 * 2**29),)),
    ("MemoryMax=1G 512M", (P("MemoryMax", "t", 2**30 + 2**29),)),
    ("MemoryMax=2T", (P("MemoryMax", "t", 2 * 2**40),)),
    ("MemoryMax=1P", (P("MemoryMax", "t", 2**50),)),
    ("MemoryMax=15E", (P("MemoryMax", "t", 15 * 2**60),)),
    ("MemoryMax=100B", (P("MemoryMax", "t", 100),)),
    ("MemoryMax=infinity", (P("MemoryMax", "t", INFINITY),)),
    ("MemoryMax=", (P("MemoryMax", "t", INFINITY),)),
    # a percentage is sent as <Name>Scale, a fraction of 2**32-1 (rounded), and the
    # manager multiplies it with the physical memory
    ("MemoryMax=50%", (P("MemoryMaxScale", "u", HALF),)),
    ("MemoryMax=100%", (P("MemoryMaxScale", "u", UINT32_MAX),)),
    ("MemoryMax=12.34%", (P("MemoryMaxScale", "u", (1234 * UINT32_MAX + 5000) // 10000),)),
    ("MemoryMax=5‰", (P("MemoryMaxScale", "u", (50 * UINT32_MAX + 5000) // 10000),)),
    ("MemoryHigh=8G", (P("MemoryHigh", "t", 8 * 2**30),)),
    ("MemoryHigh=75%", (P("MemoryHighScale", "u", (7500 * UINT32_MAX + 5000) // 10000),)),
    ("MemorySwapMax=0", (P("MemorySwapMax", "t", 0),)),
    ("MemorySwapMax=", (P("MemorySwapMax", "t", INFINITY),)),
    ("MemoryLow=1G", (P("MemoryLow", "t", 2**30),)),
    # empty protection means none (CGROUP_LIMIT_MIN), empty limits mean no limit
    ("MemoryLow=", (P("MemoryLow", "t", 0),)),
    ("MemoryMin=0", (P("MemoryMin", "t", 0),)),
    ("MemoryMin=10%", (P("MemoryMinScale", "u", (1000 * UINT32_MAX + 5000) // 10000),)),
    ("DefaultMemoryLow=64M", (P("DefaultMemoryLow", "t", 64 * 2**20),)),
    ("TasksMax=512", (P("TasksMax", "t", 512),)),
    ("TasksMax=infinity", (P("TasksMax", "t", INFINITY),)),
    ("TasksMax=", (P("TasksMax", "t", INFINITY),)),
    ("TasksMax=50%", (P("TasksMaxScale", "u", HALF),)),
    ("CPUWeight=1", (P("CPUWeight", "t", 1),)),
    ("CPUWeight=10000", (P("CPUWeight", "t", 10000),)),
    ("CPUWeight=idle", (P("CPUWeight", "t", 0),)),
    ("CPUWeight=", (P("CPUWeight", "t", 2**64 - 1),)),
    ("StartupCPUWeight=200", (P("StartupCPUWeight", "t", 200),)),
    ("IOWeight=500", (P("IOWeight", "t", 500),)),
    ("StartupIOWeight=10000", (P("StartupIOWeight", "t", 10000),)),
    # CPUQuota=N% is N% of one CPU per second: N * 10000 usec
    ("CPUQuota=150%", (P("CPUQuotaPerSecUSec", "t", 1_500_000),)),
    ("CPUQuota=12.5%", (P("CPUQuotaPerSecUSec", "t", 125_000),)),
    ("CPUQuota=800%", (P("CPUQuotaPerSecUSec", "t", 8_000_000),)),
    ("CPUQuota=", (P("CPUQuotaPerSecUSec", "t", INFINITY),)),
    ("CPUQuotaPeriodSec=10ms", (P("CPUQuotaPeriodUSec", "t", 10_000),)),
    ("CPUQuotaPeriodSec=", (P("CPUQuotaPeriodUSec", "t", INFINITY),)),
    # cpu_set_to_dbus(): bit n of byte n/8, padded to whole 8-byte words
    ("AllowedCPUs=0-3", (P("AllowedCPUs", "ay", bytes([0x0F, 0, 0, 0, 0, 0, 0, 0])),)),
    ("AllowedCPUs=0-3,8", (P("AllowedCPUs", "ay", bytes([0x0F, 0x01, 0, 0, 0, 0, 0, 0])),)),
    ("AllowedCPUs=1 3 5", (P("AllowedCPUs", "ay", bytes([0x2A, 0, 0, 0, 0, 0, 0, 0])),)),
    ("AllowedCPUs=63", (P("AllowedCPUs", "ay", bytes([0] * 7 + [0x80])),)),
    ("AllowedCPUs=64", (P("AllowedCPUs", "ay", bytes([0] * 8 + [1] + [0] * 7)),)),
    ("AllowedCPUs=", (P("AllowedCPUs", "ay", b""),)),
    ("StartupAllowedCPUs=2", (P("StartupAllowedCPUs", "ay", bytes([4, 0, 0, 0, 0, 0, 0, 0])),)),
    ("AllowedMemoryNodes=0", (P("AllowedMemoryNodes", "ay", bytes([1, 0, 0, 0, 0, 0, 0, 0])),)),
    (
        "StartupAllowedMemoryNodes=0-1",
        (P("StartupAllowedMemoryNodes", "ay", bytes([3, 0, 0, 0, 0, 0, 0, 0])),),
    ),
    ("DevicePolicy=closed", (P("DevicePolicy", "s", "closed"),)),
    ("DevicePolicy=strict", (P("DevicePolicy", "s", "strict"),)),
    ("DevicePolicy=auto", (P("DevicePolicy", "s", "auto"),)),
    ("DeviceAllow=/dev/char/195:0 rw", (P("DeviceAllow", "a(ss)", [("/dev/char/195:0", "rw")]),)),
    ("DeviceAllow=/dev/nvidiactl rwm", (P("DeviceAllow", "a(ss)", [("/dev/nvidiactl", "rwm")]),)),
    ("DeviceAllow=/dev/block/8:0 r", (P("DeviceAllow", "a(ss)", [("/dev/block/8:0", "r")]),)),
    ("DeviceAllow=char-nvidia-uvm w", (P("DeviceAllow", "a(ss)", [("char-nvidia-uvm", "w")]),)),
    ("DeviceAllow=block-loop m", (P("DeviceAllow", "a(ss)", [("block-loop", "m")]),)),
    # no rights: sent empty, which the manager reads as rwm
    ("DeviceAllow=/dev/null", (P("DeviceAllow", "a(ss)", [("/dev/null", "")]),)),
    ('DeviceAllow="/dev/nvidia0" rw', (P("DeviceAllow", "a(ss)", [("/dev/nvidia0", "rw")]),)),
    ("DeviceAllow=/dev/100%%", (P("DeviceAllow", "a(ss)", [("/dev/100%", "")]),)),
    ("DeviceAllow=", (P("DeviceAllow", "a(ss)", []),)),
    ("CPUAccounting=true", (P("CPUAccounting", "b", True),)),
    ("MemoryAccounting=on", (P("MemoryAccounting", "b", True),)),
    ("IOAccounting=no", (P("IOAccounting", "b", False),)),
    ("TasksAccounting=1", (P("TasksAccounting", "b", True),)),
    ("ManagedOOMPreference=avoid", (P("ManagedOOMPreference", "s", "avoid"),)),
    ("ManagedOOMPreference=omit", (P("ManagedOOMPreference", "s", "omit"),)),
    ("ManagedOOMPreference=none", (P("ManagedOOMPreference", "s", "none"),)),
    ("ManagedOOMSwap=kill", (P("ManagedOOMSwap", "s", "kill"),)),
    ("ManagedOOMMemoryPressure=auto", (P("ManagedOOMMemoryPressure", "s", "auto"),)),
    (
        "ManagedOOMMemoryPressureLimit=50%",
        (P("ManagedOOMMemoryPressureLimit", "u", HALF),),
    ),
    ("ManagedOOMMemoryPressureLimit=0%", (P("ManagedOOMMemoryPressureLimit", "u", 0),)),
]


@pytest.mark.parametrize(("section", "line", "expected"), GOOD, ids=[g[1] for g in GOOD])
def test_good_values(section: str, line: str, expected: tuple[Property, ...]) -> None:
    assert parse(section, line) == expected


@pytest.mark.parametrize("unit_type", ["scope", "slice"])
@pytest.mark.parametrize(("line", "expected"), CGROUP_GOOD, ids=[g[0] for g in CGROUP_GOOD])
def test_resource_control(unit_type: str, line: str, expected: tuple[Property, ...]) -> None:
    assert parse(unit_type.capitalize(), line, unit_type=unit_type) == expected


@pytest.mark.parametrize(
    ("value", "usec"),
    [
        ("10", 10_000_000),
        ("10s", 10_000_000),
        ("10 sec", 10_000_000),
        ("1min 30s", 90_000_000),
        ("1min30s", 90_000_000),
        ("1m", 60_000_000),  # minutes ...
        ("1M", 2_629_800_000_000),  # ... and months
        ("500ms", 500_000),
        ("250us", 250),
        ("250µs", 250),
        ("2h", 7_200_000_000),
        ("1d 1h", 90_000_000_000),
        ("1w", 604_800_000_000),
        ("1y", 31_557_600_000_000),
        ("1.5s", 1_500_000),
        ("1.5", 1_500_000),
        (".5s", 500_000),
        ("1.2345678s", 1_234_567),  # digits below the microsecond are dropped
        ("0", 0),
        ("infinity", INFINITY),
    ],
)
def test_time_spans(value: str, usec: int) -> None:
    assert parse("Scope", f"TimeoutStopSec={value}") == (P("TimeoutStopUSec", "t", usec),)


@pytest.mark.parametrize("value", ["yes", "YES", "y", "true", "t", "on", "1"])
def test_true(value: str) -> None:
    assert parse("Scope", f"SendSIGKILL={value}") == (P("SendSIGKILL", "b", True),)


@pytest.mark.parametrize("value", ["no", "No", "n", "false", "f", "off", "0"])
def test_false(value: str) -> None:
    assert parse("Scope", f"SendSIGKILL={value}") == (P("SendSIGKILL", "b", False),)


# (line, section, unit type, substrings of the message); the setting must be named too.
BAD: list[tuple[str, str, str, tuple[str, ...]]] = [
    ("MemoryMax=12Q", "Scope", "scope", ("MemoryMax=12Q: not a size", "K, M, G", "infinity")),
    ("MemoryMax=1g", "Scope", "scope", ("not a size",)),  # suffixes are upper case
    ("MemoryMax=1M 1G", "Scope", "scope", ("not a size",)),  # larger units first
    ("MemoryMax=-1G", "Scope", "scope", ("negative size",)),
    ("MemoryMax=16E", "Scope", "scope", ("size too large",)),
    ("MemoryMax=150%", "Scope", "scope", ("above 100%",)),
    ("MemoryMax=1.234%", "Scope", "scope", ("at most two decimals",)),
    ("MemoryMax=0", "Scope", "scope", ("no memory at all",)),
    ("MemoryHigh=0%", "Slice", "slice", ("no memory at all",)),
    ("TasksMax=0", "Scope", "scope", ("out of range",)),
    ("TasksMax=100%", "Scope", "scope", ("below 100%", "infinity")),
    ("TasksMax=lots", "Scope", "scope", ("not a decimal number",)),
    ("TasksMax=010", "Scope", "scope", ("octal",)),
    ("CPUWeight=0", "Scope", "scope", ("out of range", "1 to 10000, or idle")),
    ("CPUWeight=10001", "Slice", "slice", ("out of range",)),
    ("IOWeight=idle", "Scope", "scope", ("not a decimal number", "1 to 10000")),
    ("CPUQuota=0%", "Scope", "scope", ("too small",)),
    ("CPUQuota=150", "Scope", "scope", ("not a percentage", "150%")),
    ("CPUQuotaPeriodSec=soon", "Scope", "scope", ("not a time span",)),
    ("AllowedCPUs=3-1", "Scope", "scope", ("backwards", "0-3,8")),
    ("AllowedCPUs=1-", "Scope", "scope", ("bad range",)),
    ("AllowedCPUs=a", "Scope", "scope", ("bad range",)),
    ("AllowedCPUs=8192", "Scope", "scope", ("above the limit",)),
    ("AllowedCPUs=01", "Scope", "scope", ("octal",)),
    ("DevicePolicy=open", "Scope", "scope", ("unknown value 'open'", "auto, closed or strict")),
    ("DeviceAllow=/tmp/fake rw", "Scope", "scope", ("not a device node path", "/dev/char/")),
    ("DeviceAllow=/dev/../etc/x rw", "Scope", "scope", ("not a device node path",)),
    ("DeviceAllow=/dev/char/nvidia rw", "Scope", "scope", ("MAJOR:MINOR",)),
    ("DeviceAllow=/dev/null rx", "Scope", "scope", ("combination of r, w and m",)),
    ("DeviceAllow=char- rw", "Scope", "scope", ("names no device group",)),
    ("DeviceAllow=%n rw", "Scope", "scope", ("unit specifier '%n'", "%%")),
    ('DeviceAllow="/dev/my dev" rw', "Scope", "scope", ("contains whitespace",)),
    ("DeviceAllow='/dev/null rw", "Scope", "scope", ("unbalanced quotes",)),
    ("KillMode=group", "Scope", "scope", ("unknown value", "control-group, mixed")),
    ("KillSignal=SIGFOO", "Scope", "scope", ("not a signal", "SIGTERM")),
    ("KillSignal=0", "Scope", "scope", ("out of range",)),
    ("KillSignal=65", "Scope", "scope", ("out of range",)),
    ("KillSignal=RTMIN+40", "Scope", "scope", ("out of range",)),
    ("SendSIGKILL=maybe", "Scope", "scope", ("not a boolean", "yes/no")),
    ("SendSIGKILL=", "Scope", "scope", ("not a boolean",)),
    ("TimeoutStopSec=", "Scope", "scope", ("empty time span", "1min 30s")),
    ("TimeoutStopSec=-5", "Scope", "scope", ("negative",)),
    ("TimeoutStopSec=5x", "Scope", "scope", ("unknown time unit",)),
    ("TimeoutStopSec=1.s", "Scope", "scope", ("no digits after",)),
    ("TimeoutStopSec=1.2.3", "Scope", "scope", ("unknown time unit",)),
    ("TimeoutStopSec=infinityx", "Scope", "scope", ("not a time span",)),
    ("TimeoutStopSec=99999999999y", "Scope", "scope", ("too large",)),
    ("OOMPolicy=panic", "Scope", "scope", ("unknown value", "continue, stop or kill")),
    ("Delegate=cpu bogus", "Scope", "scope", ("neither a boolean nor a cgroup controller",)),
    ("Slice=gpulaunch.scope", "Scope", "scope", ("not a .slice unit name",)),
    ("Slice=has space.slice", "Scope", "scope", ("not a .slice unit name",)),
    ("Slice=", "Scope", "scope", ("not a .slice unit name",)),
    ("Slice=a@b.slice", "Scope", "scope", ("not a .slice unit name",)),
    ("ManagedOOMSwap=always", "Slice", "slice", ("auto or kill",)),
    ("ManagedOOMMemoryPressureLimit=", "Slice", "slice", ("empty value",)),
    ("ManagedOOMMemoryPressureLimit=101%", "Slice", "slice", ("above 100%",)),
    ("ManagedOOMPreference=never", "Slice", "slice", ("none, avoid or omit",)),
    ("CollectMode=always", "Unit", "scope", ("inactive or inactive-or-failed",)),
    ("BindsTo=not-a-unit", "Unit", "scope", ("is not a unit name", "\\xNN")),
    ("After=a.service b", "Unit", "scope", ("'b' is not a unit name",)),
    ("Documentation=gpulaunch.readthedocs.io", "Unit", "scope", ("not a documentation URL",)),
    ("Documentation=%%x", "Unit", "scope", ("'%x' is not a documentation URL",)),
    ("Documentation='man:x", "Unit", "scope", ("unbalanced quotes",)),
    ("Description=100%", "Unit", "scope", ("unit specifier '%'", "write %%")),
    ("Description=%n", "Unit", "scope", ("unit specifier '%n'",)),
    ("JobRunningTimeoutSec=x", "Unit", "scope", ("not a time span",)),
]


@pytest.mark.parametrize(
    ("line", "section", "unit_type", "substrings"), BAD, ids=[b[0] for b in BAD]
)
def test_bad_values(line: str, section: str, unit_type: str, substrings: tuple[str, ...]) -> None:
    exc = error(section, line, unit_type=unit_type)
    key = line.partition("=")[0]
    assert exc.message.startswith(f"{SOURCE}:2: {line}: ")
    assert (exc.source, exc.line, exc.setting) == (SOURCE, 2, key)
    for text in substrings:
        assert text in exc.message
    assert exc.hint and exc.hint.startswith("see systemd.")
    assert isinstance(exc, TemplateError) and exc.exit_code == 78


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ("LogRateLimitBurst=100000", "see journald.conf RateLimitBurst= for scopes"),
        ("LogRateLimitIntervalSec=1s", "see journald.conf RateLimitIntervalSec= for scopes"),
        ("LogExtraFields=RANK=0", "attributes rank lines by their unit"),
        ("LogLevelMax=info", "journalctl -p"),
        ("Environment=RANK=0", "gives every rank its environment"),
        ("StandardOutput=journal", "connects rank output to the journal"),
        ("WorkingDirectory=/tmp", "working directory"),
        ("Nice=5", ""),
        ("LimitNOFILE=65536", ""),
    ],
)
@pytest.mark.parametrize("unit_type", ["scope", "slice"])
def test_exec_settings_are_refused_with_the_reason(unit_type: str, line: str, reason: str) -> None:
    key = line.partition("=")[0]
    exc = error(unit_type.capitalize(), line, unit_type=unit_type)
    assert f"{key}= is an exec setting; systemd refuses it on {unit_type} units" in exc.message
    assert "only services accept it" in exc.message and reason in exc.message
    assert exc.setting == key and exc.line == 2


def test_the_log_rate_limit_message_in_full() -> None:
    exc = error("Scope", "LogRateLimitBurst=100000")
    assert exc.message == (
        f"{SOURCE}:2: LogRateLimitBurst= is an exec setting; systemd refuses it on scope units "
        "(only services accept it; see journald.conf RateLimitBurst= for scopes)"
    )


@pytest.mark.parametrize("line", ["ExecStart=/bin/true", "Restart=always", "TimeoutStartSec=5"])
def test_service_settings_are_refused(line: str) -> None:
    exc = error("Scope", line)
    assert "is a service setting; systemd refuses it on scope units" in exc.message


def test_user_on_a_scope_says_what_it_would_really_do() -> None:
    exc = error("Scope", "User=nobody")
    assert "delegated cgroup" in exc.message and "does not run the ranks" in exc.message
    assert "exec setting" in error("Slice", "User=nobody", unit_type="slice").message


def test_job_timeout_is_refused_because_systemd_252_refuses_it() -> None:
    exc = error("Unit", "JobTimeoutSec=10")
    assert "Cannot set property" in exc.message and "JobRunningTimeoutSec=" in exc.message


@pytest.mark.parametrize(
    ("line", "replacement"),
    [("CPUShares=100", "CPUWeight="), ("MemoryLimit=1G", "MemoryMax="), ("BlockIOWeight=1", "IO")],
)
def test_deprecated_settings_point_to_the_new_one(line: str, replacement: str) -> None:
    exc = error("Scope", line)
    assert "deprecated" in exc.message and replacement in exc.message


def test_unsupported_real_setting_is_not_called_unknown() -> None:
    exc = error("Scope", "IPAddressDeny=any")
    assert "not supported by gpulaunch" in exc.message and "unknown" not in exc.message


def test_unknown_setting_lists_what_is_accepted() -> None:
    exc = error("Scope", "MemoryMAx=1G")
    assert "unknown setting MemoryMAx= for a scope (did you mean MemoryMax=?)" in exc.message
    assert "accepted in [Scope]: " in exc.message and "TimeoutStopSec" in exc.message
    assert "Description" not in exc.message  # that one belongs in [Unit]
    exc = error("Slice", "Bogus=1", unit_type="slice")
    assert "unknown setting Bogus= for a slice; accepted in [Slice]: " in exc.message
    assert "KillMode" not in exc.message


@pytest.mark.parametrize(
    ("section", "line", "unit_type", "text"),
    [
        ("Unit", "MemoryMax=1G", "scope", "MemoryMax= belongs in [Scope], not [Unit]"),
        ("Unit", "MemoryMax=1G", "slice", "MemoryMax= belongs in [Slice], not [Unit]"),
        ("Scope", "Description=x", "scope", "Description= belongs in [Unit], not [Scope]"),
        ("Slice", "BindsTo=a.scope", "slice", "BindsTo= belongs in [Unit], not [Slice]"),
        ("Unit", "KillMode=mixed", "scope", "KillMode= belongs in [Scope], not [Unit]"),
        ("Slice", "KillMode=mixed", "slice", "KillMode= is not valid for a slice unit"),
        ("Slice", "TimeoutStopSec=5", "slice", "only scope and service units accept it"),
        ("Slice", "Slice=a.slice", "slice", "Slice= is not valid for a slice unit"),
        ("Slice", "Delegate=yes", "slice", "Delegate= is not valid for a slice unit"),
        ("Slice", "OOMPolicy=kill", "slice", "OOMPolicy= is not valid for a slice unit"),
        ("Unit", "OOMPolicy=kill", "slice", "OOMPolicy= is not valid for a slice unit"),
    ],
)
def test_wrong_section_or_unit_type(section: str, line: str, unit_type: str, text: str) -> None:
    exc = error(section, line, unit_type=unit_type)
    assert text in exc.message and exc.setting == line.partition("=")[0]


@pytest.mark.parametrize(
    ("text", "line", "message"),
    [
        ("MemoryMax=1G\n", 1, "MemoryMax= is outside any section; put it under [Unit] or [Scope]"),
        ("[Scope]\nMemoryMax 1G\n", 2, "'MemoryMax 1G' is not a setting; expected Key=value"),
        ("[Scope]\n=1G\n", 2, "'=1G' has no setting name before '='"),
        ("[Install]\nWantedBy=x\n", 1, "unknown section [Install]; use [Unit] and [Scope]"),
        ("[Slice]\n", 1, "[Slice] is for slice units, this is a scope; use [Unit] and [Scope]"),
        ("[Unit\n", 1, "bad section header '[Unit'; use [Unit] and [Scope]"),
    ],
)
def test_structure_errors(text: str, line: int, message: str) -> None:
    with pytest.raises(UnitFileError) as info:
        parse_unit(text, "scope", SOURCE)
    assert info.value.message == f"{SOURCE}:{line}: {message}"
    assert info.value.line == line


def test_lists_accumulate_and_an_empty_assignment_resets() -> None:
    props = parse(
        "Scope",
        "DeviceAllow=/dev/char/195:0 rw",
        "DevicePolicy=closed",
        "DeviceAllow=/dev/null",
        "DeviceAllow=",
        "DeviceAllow=/dev/char/195:255 rw",
        "DeviceAllow=char-nvidia-uvm rw",
    )
    assert props == (
        P("DeviceAllow", "a(ss)", [("/dev/char/195:255", "rw"), ("char-nvidia-uvm", "rw")]),
        P("DevicePolicy", "s", "closed"),
    )
    props = parse("Unit", "After=a.scope b.scope", "Before=c.scope", "After=d.scope")
    assert props == (
        P("After", "as", ["a.scope", "b.scope", "d.scope"]),
        P("Before", "as", ["c.scope"]),
    )
    assert parse("Unit", "Wants=a.scope", "Wants=") == (P("Wants", "as", []),)
    props = parse("Unit", "Documentation=man:a(1)", "Documentation=", "Documentation=man:b(1)")
    assert props == (P("Documentation", "as", ["man:b(1)"]),)


def test_a_later_assignment_replaces_an_earlier_one() -> None:
    props = parse("Scope", "MemoryMax=1G", "KillMode=mixed", "MemoryMax=50%", "MemoryMax=2G")
    assert props == (P("KillMode", "s", "mixed"), P("MemoryMax", "t", 2 * 2**30))
    props = parse("Scope", "MemoryMax=1G", "MemoryMax=50%")
    assert props == (P("MemoryMaxScale", "u", HALF),)
    assert parse("Scope", "Delegate=cpu", "Delegate=no") == (P("Delegate", "b", False),)


def test_syntax_comments_continuations_and_sections() -> None:
    text = (
        "# a comment\n"
        "; another\n"
        "[Unit]\n"
        "  Description = spaced out  \n"
        "[Scope]\n"
        "DeviceAllow=/dev/char/195:0 \\\n"
        "# a comment inside a continuation is skipped\n"
        "  rw\n"
        "[Unit]\n"
        "CollectMode=inactive\r\n"
        "\n"
    )
    assert parse_unit(text, "scope", SOURCE) == (
        P("Description", "s", "spaced out"),
        P("DeviceAllow", "a(ss)", [("/dev/char/195:0", "rw")]),
        P("CollectMode", "s", "inactive"),
    )
    # a doubled backslash at the end does not continue the line
    assert parse("Unit", "Description=a\\\\", "CollectMode=inactive")[0] == P(
        "Description", "s", "a\\\\"
    )


def test_an_error_in_a_continued_line_names_its_first_line() -> None:
    with pytest.raises(UnitFileError) as info:
        parse_unit("[Scope]\nTasksMax=\\\n 1 2\n", "scope", SOURCE)
    assert info.value.line == 2 and "TasksMax=1 2: not a decimal number" in info.value.message


def test_empty_text_and_empty_sections() -> None:
    assert parse_unit("", "slice", SOURCE) == ()
    assert parse_unit("[Unit]\n[Slice]\n", "slice", SOURCE) == ()


def test_unit_type_is_checked() -> None:
    with pytest.raises(ValueError):
        parse_unit("", "socket", SOURCE)


def test_values_fit_pystemd_signatures() -> None:
    """Each value has the Python shape pystemd's apply_signature turns into D-Bus."""
    dbuslib = pytest.importorskip("pystemd.dbuslib")
    props = parse(
        "Scope",
        "Slice=a.slice",
        "MemoryMax=50%",
        "TimeoutStopSec=5",
        "SendSIGKILL=yes",
        "KillSignal=TERM",
        "AllowedCPUs=0-3",
        "DeviceAllow=/dev/null rw",
        "Delegate=cpu",
    ) + parse("Unit", "BindsTo=a.scope")
    for prop in props:
        encoded = dbuslib.apply_signature(prop.signature.encode(), [prop.value])
        assert encoded, prop
