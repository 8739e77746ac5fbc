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

Where systemd's grammar is looser than needed, the codec accepts a plain subset
and refuses the rest with a message: integers are decimal without leading
zeros (systemd reads `010` as octal 8), percentages have at most two decimals.
Everything accepted maps to exactly the value `systemd-run` would send.

Settings that accumulate (dependencies, Documentation=, DeviceAllow=) are
merged into one property; an empty assignment resets the list. For any other
setting a later assignment replaces an earlier one, as in systemd.
"""

from __future__ import annotations

import difflib
import re
import signal
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from gpulaunch.errors import UnitFileError

UINT32_MAX = 2**32 - 1
UINT64_MAX = 2**64 - 1
INFINITY = UINT64_MAX  # USEC_INFINITY and CGROUP_LIMIT_MAX (src/basic/time-util.h, cgroup-util.h)

_WHITESPACE = " \t\n\r"  # systemd's WHITESPACE (src/basic/string-util.h)
_UNIT_TYPES = ("scope", "slice")


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


class _Invalid(Exception):
    """A value is wrong; `problem` says what. The setting's table entry says what is accepted."""

    def __init__(self, problem: str, accepted: str | None = None) -> None:
        super().__init__(problem)
        self.problem = problem
        self.accepted = accepted


# --- value grammars -------------------------------------------------------------------------

_DECIMAL = re.compile(r"0|[1-9][0-9]*")


def _decimal(text: str, what: str = "a decimal number") -> int:
    """A non-negative decimal integer. systemd's safe_atou64() also takes 0x/0o/0b and octal."""
    if _DECIMAL.fullmatch(text):
        return int(text)
    if re.fullmatch(r"0[0-9]+", text):
        raise _Invalid(f"leading zero in {text!r} (systemd would read it as octal)")
    raise _Invalid(f"not {what}")


_TRUE = ("1", "yes", "y", "true", "t", "on")
_FALSE = ("0", "no", "n", "false", "f", "off")
BOOLEAN_ACCEPTED = "use yes/no, true/false, on/off or 1/0"


def parse_boolean(text: str) -> bool:
    """systemd's parse_boolean() (src/basic/parse-util.c): case-insensitive."""
    if text.lower() in _TRUE:
        return True
    if text.lower() in _FALSE:
        return False
    raise _Invalid("not a boolean", BOOLEAN_ACCEPTED)


_USEC_PER_SEC = 1_000_000
_SEC, _MIN, _HOUR, _DAY = _USEC_PER_SEC, 60 * _USEC_PER_SEC, 3600 * _USEC_PER_SEC, 86400 * 10**6
_WEEK, _MONTH, _YEAR = 7 * _DAY, 2_629_800 * _SEC, 31_557_600 * _SEC
# Order matters: the first prefix that matches wins (extract_multiplier(), src/basic/time-util.c).
# fmt: off
_TIME_SUFFIXES: tuple[tuple[str, int], ...] = (
    ("seconds", _SEC), ("second", _SEC), ("sec", _SEC), ("s", _SEC),
    ("minutes", _MIN), ("minute", _MIN), ("min", _MIN),
    ("months", _MONTH), ("month", _MONTH), ("M", _MONTH),
    ("msec", 1000), ("ms", 1000), ("m", _MIN),
    ("hours", _HOUR), ("hour", _HOUR), ("hr", _HOUR), ("h", _HOUR),
    ("days", _DAY), ("day", _DAY), ("d", _DAY),
    ("weeks", _WEEK), ("week", _WEEK), ("w", _WEEK),
    ("years", _YEAR), ("year", _YEAR), ("y", _YEAR),
    ("usec", 1), ("us", 1), ("\u03bcs", 1), ("\u00b5s", 1),  # Greek mu, micro sign
)
# fmt: on
TIMESPAN_ACCEPTED = "use a time span such as 90, 90s, 1min 30s, 500ms, 2h, or infinity"


def _skip_ws(text: str, i: int) -> int:
    while i < len(text) and text[i] in _WHITESPACE:
        i += 1
    return i


def parse_timespan(text: str) -> int:
    """A time span in microseconds: systemd's parse_sec() (parse_time(), src/basic/time-util.c).

    Seconds are the default unit; parts add up ("1min 30s"); "infinity" is 2**64-1.
    """
    p = _skip_ws(text, 0)
    if text.startswith("infinity", p):
        if _skip_ws(text, p + len("infinity")) != len(text):
            raise _Invalid("not a time span", TIMESPAN_ACCEPTED)
        return INFINITY
    total = 0
    something = False
    while True:
        p = _skip_ws(text, p)
        if p == len(text):
            if not something:
                raise _Invalid("empty time span", TIMESPAN_ACCEPTED)
            return total
        if text[p] == "-":
            raise _Invalid("negative time span", TIMESPAN_ACCEPTED)
        m = re.compile(r"\+?[0-9]+").match(text, p)
        whole = int(m.group()) if m else 0
        e = m.end() if m else p
        fraction = ""
        if e < len(text) and text[e] == ".":
            f = re.compile(r"[0-9]*").match(text, e + 1)
            assert f is not None
            fraction = f.group()
            if not fraction:
                raise _Invalid(f"no digits after '.' in {text!r}", TIMESPAN_ACCEPTED)
            p = f.end()
        elif not m:
            raise _Invalid("not a time span", TIMESPAN_ACCEPTED)
        else:
            p = e
        s = _skip_ws(text, p)
        multiplier = _USEC_PER_SEC
        for suffix, usec in _TIME_SUFFIXES:
            if text.startswith(suffix, s):
                multiplier = usec
                s += len(suffix)
                break
        else:
            if s == p and s != len(text):
                raise _Invalid(f"unknown time unit in {text!r}", TIMESPAN_ACCEPTED)
        p = s
        if whole >= INFINITY // multiplier or whole * multiplier >= INFINITY - total:
            raise _Invalid("time span too large", TIMESPAN_ACCEPTED)
        total += whole * multiplier
        scale = multiplier // 10
        for digit in fraction:
            if int(digit) * scale >= INFINITY - total:
                raise _Invalid("time span too large", TIMESPAN_ACCEPTED)
            total += int(digit) * scale
            scale //= 10
        something = True


# parse_size() with base 1024 (src/basic/parse-util.c); the order is the order suffixes may follow.
# fmt: off
_SIZE_SUFFIXES: tuple[tuple[str, int], ...] = (
    ("E", 1024**6), ("P", 1024**5), ("T", 1024**4), ("G", 1024**3), ("M", 1024**2), ("K", 1024),
    ("B", 1), ("", 1),
)
# fmt: on


def parse_size(text: str) -> int:
    """Bytes, with K/M/G/T/P/E suffixes (base 1024), fractions and sums ("1G 512M", "1.5G")."""
    total = 0
    start = 0
    p = 0
    while True:
        p = _skip_ws(text, p)
        m = re.compile(r"[+-]?[0-9]+").match(text, p)
        if not m:
            raise _Invalid("not a size")
        if m.group().startswith("-"):
            raise _Invalid("negative size")
        whole = int(m.group())
        e = m.end()
        fraction = 0.0
        if e < len(text) and text[e] == ".":
            e += 1
            f = re.compile(r"[0-9]+").match(text, e)
            if f:
                # The same double arithmetic as systemd: digits, then /10 per digit.
                fraction = float(int(f.group()))
                for _ in f.group():
                    fraction /= 10
                e = f.end()
        e = _skip_ws(text, e)
        for index in range(start, len(_SIZE_SUFFIXES)):
            suffix, factor = _SIZE_SUFFIXES[index]
            if text.startswith(suffix, e):
                break
        else:  # pragma: no cover - "" always matches
            raise _Invalid("not a size")
        if whole + (fraction > 0) > UINT64_MAX // factor:
            raise _Invalid("size too large")
        total += whole * factor + int(fraction * factor)
        if total > UINT64_MAX:
            raise _Invalid("size too large")
        p = e + len(suffix)
        start = index + 1
        if p >= len(text):
            return total


_PERCENT = re.compile(r"(0|[1-9][0-9]*)(?:\.([0-9]{1,2}))?%")
_PERMILLE = re.compile(r"(0|[1-9][0-9]*)(?:\.([0-9]))?\u2030")
_PERMYRIAD = re.compile(r"(0|[1-9][0-9]*)\u2031")
_INT_MAX = 2**31 - 1


def parse_permyriad(text: str, *, bounded: bool = True) -> int | None:
    """A percentage in 1/10000 units ("12.34%", "5.5‰", "3‱"), or None if `text` is not one.

    systemd's parse_permyriad() (src/basic/percent-util.c); `bounded` refuses more than 100%.
    """
    if not text.endswith(("%", "\u2030", "\u2031")):
        return None
    for pattern, scale, places in ((_PERCENT, 100, 2), (_PERMILLE, 10, 1), (_PERMYRIAD, 1, 0)):
        m = pattern.fullmatch(text)
        if m:
            decimals = ((m.group(2) or "") if places else "").ljust(places, "0")
            value = int(m.group(1)) * scale + (int(decimals) if decimals else 0)
            if value > _INT_MAX:
                raise _Invalid("percentage too large")
            if bounded and value > 10000:
                raise _Invalid("percentage above 100%")
            return value
    raise _Invalid("not a percentage (at most two decimals, e.g. 12.5%)")


def scale_from_permyriad(permyriad: int) -> int:
    """UINT32_SCALE_FROM_PERMYRIAD() (src/basic/percent-util.h): 100% is 2**32-1, rounded."""
    return (min(max(permyriad, 0), 10000) * UINT32_MAX + 5000) // 10000


# Signals: the names systemd knows (static_signal_table, src/basic/signal-util.c), numbered as
# on this machine, plus RTMIN+n / RTMAX-n. Valid numbers are 1.._NSIG-1.
_SIGNAL_NAMES = (
    "HUP INT QUIT ILL TRAP ABRT BUS FPE KILL USR1 SEGV USR2 PIPE ALRM TERM STKFLT CHLD CONT "
    "STOP TSTP TTIN TTOU URG XCPU XFSZ VTALRM PROF WINCH IO PWR SYS"
).split()
_SIGNALS = {n: int(getattr(signal, "SIG" + n)) for n in _SIGNAL_NAMES if hasattr(signal, "SIG" + n)}
_SIGRTMIN = int(signal.SIGRTMIN)
_SIGRTMAX = int(signal.SIGRTMAX)
SIGNAL_ACCEPTED = "use a signal name (SIGTERM or TERM, RTMIN+n, RTMAX-n) or a number 1-64"


def parse_signal(text: str) -> int:
    """systemd's signal_from_string(): a number, NAME, SIGNAME, RTMIN+n or RTMAX-n."""
    if text[:1].isdigit():
        number = _decimal(text, "a signal")
        if not 1 <= number <= _SIGRTMAX:
            raise _Invalid(f"signal number {number} out of range", SIGNAL_ACCEPTED)
        return number
    name = text.removeprefix("SIG")
    if name in _SIGNALS:
        return _SIGNALS[name]
    m = re.fullmatch(r"RTMIN(?:\+(0|[1-9][0-9]*))?|RTMAX(?:-(0|[1-9][0-9]*))?", name)
    if m:
        if m.group().startswith("RTMIN"):
            number = _SIGRTMIN + int(m.group(1) or 0)
        else:
            number = _SIGRTMAX - int(m.group(2) or 0)
        if _SIGRTMIN <= number <= _SIGRTMAX:
            return number
        raise _Invalid("real-time signal out of range", SIGNAL_ACCEPTED)
    raise _Invalid("not a signal", SIGNAL_ACCEPTED)


_CPU_MASK_BYTES = struct.calcsize("L")  # sizeof(__cpu_mask): CPU_ALLOC_SIZE() rounds to it
_CPU_SET_MAX = 8192  # cpu_set_add() (src/shared/cpu-set-util.c)
CPUSET_ACCEPTED = "use numbers and ranges separated by commas or spaces, e.g. 0-3,8"


def parse_cpu_set(text: str) -> bytes:
    """A CPU or NUMA node list as the bytes cpu_set_to_dbus() sends (src/shared/cpu-set-util.c).

    Bit n of byte n//8 is CPU n (little-endian), and the length is systemd's allocation: whole
    `unsigned long` words, 8 bytes on 64-bit ("0-3" is 0f 00 00 00 00 00 00 00). Empty: b"".
    """
    mask = 0
    highest = -1
    for word in re.split(r"[ \t\n\r,]+", text.strip(_WHITESPACE + ",")):
        if not word:
            continue
        m = re.fullmatch(r"([0-9]+)(?:-([0-9]+))?", word)
        if not m:
            raise _Invalid(f"bad range {word!r}", CPUSET_ACCEPTED)
        lower = _decimal(m.group(1))
        upper = _decimal(m.group(2)) if m.group(2) is not None else lower
        if lower > upper:
            raise _Invalid(f"range {word!r} is backwards", CPUSET_ACCEPTED)
        if upper >= _CPU_SET_MAX:
            raise _Invalid(f"{upper} is above the limit of {_CPU_SET_MAX - 1}", CPUSET_ACCEPTED)
        mask |= ((1 << (upper - lower + 1)) - 1) << lower
        highest = max(highest, upper)
    if highest < 0:
        return b""
    words = (highest + 1 + 8 * _CPU_MASK_BYTES - 1) // (8 * _CPU_MASK_BYTES)
    return mask.to_bytes(words * _CPU_MASK_BYTES, "little")


def next_word(text: str, i: int, *, unquote: bool, retain_escape: bool) -> tuple[str, int] | None:
    """The word at or after `i`, and the index after it; None when only whitespace is left.

    extract_first_word() (src/basic/extract-word.c): words are separated by whitespace;
    `unquote` removes '...' and "..." quoting (EXTRACT_UNQUOTE); without `retain_escape` a
    backslash takes the next character literally, with it backslashes are kept as written.
    """
    i = _skip_ws(text, i)
    if i == len(text):
        return None
    word: list[str] = []
    quote = ""
    while i < len(text):
        c = text[i]
        if c == "\\" and not retain_escape:
            i += 1
            if i == len(text):
                raise _Invalid("trailing backslash")
            word.append(text[i])
        elif quote:
            if c == quote:
                quote = ""
            else:
                word.append(c)
        elif c in _WHITESPACE:
            break
        elif unquote and c in "'\"":
            quote = c
        else:
            word.append(c)
        i += 1
    if quote:
        raise _Invalid("unbalanced quotes")
    return "".join(word), i


def split_words(text: str, *, unquote: bool, retain_escape: bool) -> list[str]:
    """All words of `text`, see next_word()."""
    words: list[str] = []
    i = 0
    while (found := next_word(text, i, unquote=unquote, retain_escape=retain_escape)) is not None:
        word, i = found
        words.append(word)
    return words


def expand_specifiers(text: str) -> str:
    """`%%` -> `%`. Other specifiers have no meaning in a transient unit, so they are refused."""
    m = re.search(r"%(?!%)", text.replace("%%", ""))
    if m:
        spec = text.replace("%%", "")[m.start() : m.start() + 2]
        raise _Invalid(
            f"unit specifier {spec!r} is not supported (transient units are not expanded)",
            "write %% for a literal %",
        )
    return text.replace("%%", "%")


_UNIT_NAME_CHARS = re.compile(r"[A-Za-z0-9:_.\\-]+")
_ALL_UNIT_TYPES = "service socket target device mount automount swap timer path slice scope".split()


def check_unit_name(name: str, *, suffix: str | None = None) -> str:
    """unit_name_is_valid() (src/basic/unit-name.c): plain or instance names, for `suffix` plain."""
    prefix, dot, kind = name.rpartition(".")
    ok = (
        bool(prefix)
        and len(name) < 256
        and kind in _ALL_UNIT_TYPES
        and (suffix is None or kind == suffix)
    )
    if ok:
        template, at, instance = prefix.partition("@")
        ok = bool(_UNIT_NAME_CHARS.fullmatch(template)) and (
            not at or (suffix is None and bool(re.fullmatch(r"[A-Za-z0-9:_.\\@-]+", instance)))
        )
    if not ok:
        kind_text = f"a .{suffix} unit name" if suffix else "a unit name"
        raise _Invalid(
            f"{name!r} is not {kind_text}",
            "unit names use letters, digits and :-_.\\ (escape others as \\xNN), at most 255 "
            "characters, and end in a unit type such as .scope or .slice",
        )
    return name


def check_documentation_url(url: str) -> str:
    """documentation_url_is_valid() (src/shared/web-util.c)."""
    for prefix in ("http://", "https://", "file:/", "info:", "man:"):
        rest = url.removeprefix(prefix)
        if rest != url and rest and rest.isascii():
            return url
    raise _Invalid(
        f"{url!r} is not a documentation URL", "use http://, https://, file:/, info: or man: URLs"
    )


def check_device_path(path: str) -> str:
    """valid_device_allow_pattern() (src/basic/path-util.c), a bit stricter about /dev/char/."""
    accepted = (
        "use /dev/NODE, /dev/char/MAJOR:MINOR, /dev/block/MAJOR:MINOR, char-NAME or "
        "block-NAME (see /proc/devices), then optional rights r, w, m"
    )
    for prefix in ("char-", "block-"):
        if path.startswith(prefix):
            if len(path) > len(prefix):
                return path
            raise _Invalid(f"{path!r} names no device group", accepted)
    if any(c in _WHITESPACE for c in path):
        raise _Invalid(f"{path!r} contains whitespace", accepted)
    parts = path.split("/")
    normalized = (
        path.startswith(("/dev/", "/run/systemd/inaccessible/"))
        and not path.endswith("/")
        and all(part not in ("", ".", "..") for part in parts[1:])
    )
    if not normalized:
        raise _Invalid(f"{path!r} is not a device node path", accepted)
    if re.fullmatch(r"/dev/(char|block)/.*", path) and not re.fullmatch(
        r"/dev/(char|block)/[0-9]+:[0-9]+", path
    ):
        raise _Invalid(f"{path!r}: /dev/char/ and /dev/block/ hold MAJOR:MINOR names", accepted)
    return path


# --- the settings table ---------------------------------------------------------------------

Convert = Callable[[str], tuple[Property, ...]]
Items = Callable[[str], list[object]]

_CGROUP = frozenset({"Scope", "Slice"})
_SCOPE = frozenset({"Scope"})
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
            raise _Invalid(f"unknown value {value!r}")
        return value

    return parse


def _nonempty(parse: Callable[[str], object]) -> Callable[[str], object]:
    def wrapped(value: str) -> object:
        if not value:
            raise _Invalid("empty value")
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
                raise _Invalid("0% would leave no memory at all")
            # The server scales this fraction of 2**32-1 by physical memory.
            return (Property(key + "Scale", "u", scale_from_permyriad(permyriad)),)
        size = parse_size(value)
        if size == 0 and not may_be_zero:
            raise _Invalid("0 would leave no memory at all")
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
            raise _Invalid("systemd accepts percentages above 0% and below 100% here")
        return (Property("TasksMaxScale", "u", scaled),)
    tasks = _decimal(value)
    if not 1 <= tasks <= UINT64_MAX:
        raise _Invalid(f"{tasks} is out of range")
    return (Property("TasksMax", "t", tasks),)


def _weight(name: str, *, idle: bool) -> Convert:
    """cg_weight_parse()/cg_cpu_weight_parse() (src/shared/cgroup-setup.c)."""

    def parse(value: str) -> object:
        if value == "":
            return UINT64_MAX  # CGROUP_WEIGHT_INVALID: the default
        if idle and value == "idle":
            return 0  # CGROUP_WEIGHT_IDLE
        weight = _decimal(value)
        if not 1 <= weight <= 10000:
            raise _Invalid(f"{weight} is out of range")
        return weight

    return _one(name, "t", parse)


def _cpu_quota(value: str) -> tuple[Property, ...]:
    if value == "":
        return (Property("CPUQuotaPerSecUSec", "t", INFINITY),)
    permyriad = parse_permyriad(value, bounded=False)
    if permyriad is None:
        raise _Invalid("not a percentage")
    if permyriad == 0:
        raise _Invalid("CPU quota too small")
    return (Property("CPUQuotaPerSecUSec", "t", permyriad * _USEC_PER_SEC // 10000),)


def _timespan_or_infinity(value: str) -> object:
    return INFINITY if value.strip(_WHITESPACE) == "" else parse_timespan(value)


def _oom_limit(value: str) -> object:
    permyriad = parse_permyriad(value)
    if permyriad is None:
        raise _Invalid("not a percentage")
    return scale_from_permyriad(permyriad)


_CONTROLLERS = (
    "cpu cpuacct cpuset io blkio memory devices pids bpf-firewall bpf-devices bpf-foreign "
    "bpf-socket-bind bpf-restrict-network-interfaces"
).split()


def _delegate(value: str) -> tuple[Property, ...]:
    """A boolean, or the controllers to delegate (bus_append_cgroup_property(), Delegate=)."""
    try:
        return (Property("Delegate", "b", parse_boolean(value)),)
    except _Invalid:
        pass
    controllers = split_words(value, unquote=True, retain_escape=False)
    for controller in controllers:
        if controller not in _CONTROLLERS:
            raise _Invalid(f"{controller!r} is neither a boolean nor a cgroup controller") from None
    return (Property("DelegateControllers", "as", controllers),)


def _unit_names(value: str) -> list[object]:
    # config_parse_unit_deps() splits without unquoting and keeps backslashes (\x2d escapes).
    return [check_unit_name(word) for word in split_words(value, unquote=False, retain_escape=True)]


def _documentation(value: str) -> list[object]:
    words = split_words(value, unquote=True, retain_escape=True)
    return [check_documentation_url(word) for word in words]


def _device_allow(value: str) -> list[object]:
    """config_parse_device_allow(): a path (quotes allowed), then the rights r, w, m."""
    found = next_word(value, 0, unquote=True, retain_escape=False)
    assert found is not None  # value is not empty and starts with a non-space
    path = check_device_path(found[0])
    rights = value[_skip_ws(value, found[1]) :]
    if not re.fullmatch(r"[rwm]*", rights):
        raise _Invalid(f"rights {rights!r} are not a combination of r, w and m")
    # An empty string means "rwm" to the manager; systemd-run sends it as written.
    return [(path, rights)]


_SIZE_ACCEPTED = (
    "use bytes with K, M, G, T, P or E suffix (base 1024), a percentage of physical memory, "
    "or infinity"
)
_DEPENDENCIES = (
    "Requires Requisite Wants BindsTo PartOf Upholds Conflicts Before After OnSuccess OnFailure "
    "PropagatesReloadTo ReloadPropagatedFrom PropagatesStopTo StopPropagatedFrom JoinsNamespaceOf"
).split()


_UNIT5, _SCOPE5, _KILL5 = "systemd.unit(5)", "systemd.scope(5)", "systemd.kill(5)"
_RC5 = "systemd.resource-control(5)"


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
             "a(ss)", _device_allow),
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
        if raw.lstrip(_WHITESPACE)[:1] in ("#", ";"):
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
    """Convert unit-file text for a transient `unit_type` ("scope" or "slice") into properties.

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
        stripped = raw.strip(_WHITESPACE)
        if not stripped:
            continue
        if stripped.startswith("["):
            name = stripped[1:-1] if stripped.endswith("]") else None
            if name in ("Unit", type_section):
                section = name
                continue
            accepted = f"use [Unit] and [{type_section}]"
            if name in ("Scope", "Slice"):
                raise fail(
                    f"[{name}] is for {name.lower()} units, this is a {unit_type}; {accepted}"
                )
            if name is None:
                raise fail(f"bad section header {stripped!r}; {accepted}")
            raise fail(f"unknown section [{name}]; {accepted}")
        if "=" not in stripped:
            raise fail(f"{stripped!r} is not a setting; expected Key=value")
        key, _, value = stripped.partition("=")
        key, value = key.strip(_WHITESPACE), value.strip(_WHITESPACE)
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
        except _Invalid as exc:
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
    if setting is not None:
        if section in setting.sections:
            return setting
        if type_section not in setting.sections and "Unit" not in setting.sections:
            raise fail(
                f"{key}= is not valid for a {unit_type} unit; only scope units accept it "
                "(in [Scope])",
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
