"""The value grammars of systemd unit settings, as systemd 252 parses them.

Sizes, time spans, percentages, signals, CPU sets, booleans, whitespace-separated
words with quoting, `%` specifiers, unit names, documentation URLs and device
specifications (`DeviceAllow=`). Each parser takes the text of one value and
returns a plain Python value, or raises `InvalidValue` saying what is wrong.
`gpulaunch.units.codec` maps settings to these grammars and builds D-Bus properties.

Where systemd's grammar is looser than needed, these accept a plain subset and
refuse the rest with a message: integers are decimal without leading zeros
(systemd reads `010` as octal 8), percentages have at most two decimals.
"""

from __future__ import annotations

import re
import signal
import struct

UINT32_MAX = 2**32 - 1
UINT64_MAX = 2**64 - 1
INFINITY = UINT64_MAX  # USEC_INFINITY and CGROUP_LIMIT_MAX (src/basic/time-util.h, cgroup-util.h)

WHITESPACE = " \t\n\r"  # systemd's WHITESPACE (src/basic/string-util.h)


class InvalidValue(Exception):
    """A value is wrong; `problem` says what, `accepted` (if set) what would be accepted.

    Without `accepted`, the caller (the codec's settings table) says what is accepted.
    """

    def __init__(self, problem: str, accepted: str | None = None) -> None:
        super().__init__(problem)
        self.problem = problem
        self.accepted = accepted


_DECIMAL = re.compile(r"0|[1-9][0-9]*")


def parse_decimal(text: str, what: str = "a decimal number") -> int:
    """A non-negative decimal integer. systemd's safe_atou64() also takes 0x/0o/0b and octal."""
    if _DECIMAL.fullmatch(text):
        return int(text)
    if re.fullmatch(r"0[0-9]+", text):
        raise InvalidValue(f"leading zero in {text!r} (systemd would read it as octal)")
    raise InvalidValue(f"not {what}")


_TRUE = ("1", "yes", "y", "true", "t", "on")
_FALSE = ("0", "no", "n", "false", "f", "off")
BOOLEAN_ACCEPTED = "use yes/no, true/false, on/off or 1/0"


def parse_boolean(text: str) -> bool:
    """systemd's parse_boolean() (src/basic/parse-util.c): case-insensitive."""
    if text.lower() in _TRUE:
        return True
    if text.lower() in _FALSE:
        return False
    raise InvalidValue("not a boolean", BOOLEAN_ACCEPTED)


USEC_PER_SEC = 1_000_000
_SEC, _MIN, _HOUR, _DAY = USEC_PER_SEC, 60 * USEC_PER_SEC, 3600 * USEC_PER_SEC, 86400 * 10**6
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


def skip_whitespace(text: str, i: int) -> int:
    while i < len(text) and text[i] in WHITESPACE:
        i += 1
    return i


def parse_timespan(text: str) -> int:
    """A time span in microseconds: systemd's parse_sec() (parse_time(), src/basic/time-util.c).

    Seconds are the default unit; parts add up ("1min 30s"); "infinity" is 2**64-1.
    """
    p = skip_whitespace(text, 0)
    if text.startswith("infinity", p):
        if skip_whitespace(text, p + len("infinity")) != len(text):
            raise InvalidValue("not a time span", TIMESPAN_ACCEPTED)
        return INFINITY
    total = 0
    something = False
    while True:
        p = skip_whitespace(text, p)
        if p == len(text):
            if not something:
                raise InvalidValue("empty time span", TIMESPAN_ACCEPTED)
            return total
        if text[p] == "-":
            raise InvalidValue("negative time span", TIMESPAN_ACCEPTED)
        m = re.compile(r"\+?[0-9]+").match(text, p)
        whole = int(m.group()) if m else 0
        e = m.end() if m else p
        fraction = ""
        if e < len(text) and text[e] == ".":
            f = re.compile(r"[0-9]*").match(text, e + 1)
            assert f is not None
            fraction = f.group()
            if not fraction:
                raise InvalidValue(f"no digits after '.' in {text!r}", TIMESPAN_ACCEPTED)
            p = f.end()
        elif not m:
            raise InvalidValue("not a time span", TIMESPAN_ACCEPTED)
        else:
            p = e
        s = skip_whitespace(text, p)
        multiplier = USEC_PER_SEC
        for suffix, usec in _TIME_SUFFIXES:
            if text.startswith(suffix, s):
                multiplier = usec
                s += len(suffix)
                break
        else:
            if s == p and s != len(text):
                raise InvalidValue(f"unknown time unit in {text!r}", TIMESPAN_ACCEPTED)
        p = s
        if whole >= INFINITY // multiplier or whole * multiplier >= INFINITY - total:
            raise InvalidValue("time span too large", TIMESPAN_ACCEPTED)
        total += whole * multiplier
        scale = multiplier // 10
        for digit in fraction:
            if int(digit) * scale >= INFINITY - total:
                raise InvalidValue("time span too large", TIMESPAN_ACCEPTED)
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
        p = skip_whitespace(text, p)
        m = re.compile(r"[+-]?[0-9]+").match(text, p)
        if not m:
            raise InvalidValue("not a size")
        if m.group().startswith("-"):
            raise InvalidValue("negative size")
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
        e = skip_whitespace(text, e)
        for index in range(start, len(_SIZE_SUFFIXES)):
            suffix, factor = _SIZE_SUFFIXES[index]
            if text.startswith(suffix, e):
                break
        else:  # pragma: no cover - "" always matches
            raise InvalidValue("not a size")
        if whole + (fraction > 0) > UINT64_MAX // factor:
            raise InvalidValue("size too large")
        total += whole * factor + int(fraction * factor)
        if total > UINT64_MAX:
            raise InvalidValue("size too large")
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
                raise InvalidValue("percentage too large")
            if bounded and value > 10000:
                raise InvalidValue("percentage above 100%")
            return value
    raise InvalidValue("not a percentage (at most two decimals, e.g. 12.5%)")


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
        number = parse_decimal(text, "a signal")
        if not 1 <= number <= _SIGRTMAX:
            raise InvalidValue(f"signal number {number} out of range", SIGNAL_ACCEPTED)
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
        raise InvalidValue("real-time signal out of range", SIGNAL_ACCEPTED)
    raise InvalidValue("not a signal", SIGNAL_ACCEPTED)


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
    for word in re.split(r"[ \t\n\r,]+", text.strip(WHITESPACE + ",")):
        if not word:
            continue
        m = re.fullmatch(r"([0-9]+)(?:-([0-9]+))?", word)
        if not m:
            raise InvalidValue(f"bad range {word!r}", CPUSET_ACCEPTED)
        lower = parse_decimal(m.group(1))
        upper = parse_decimal(m.group(2)) if m.group(2) is not None else lower
        if lower > upper:
            raise InvalidValue(f"range {word!r} is backwards", CPUSET_ACCEPTED)
        if upper >= _CPU_SET_MAX:
            raise InvalidValue(f"{upper} is above the limit of {_CPU_SET_MAX - 1}", CPUSET_ACCEPTED)
        mask |= ((1 << (upper - lower + 1)) - 1) << lower
        highest = max(highest, upper)
    if highest < 0:
        return b""
    words = (highest + 1 + 8 * _CPU_MASK_BYTES - 1) // (8 * _CPU_MASK_BYTES)
    return mask.to_bytes(words * _CPU_MASK_BYTES, "little")


_C_ESCAPES = {
    "a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v",
    "s": " ", "\\": "\\", '"': '"', "'": "'",
}  # fmt: skip


def _cunescape_one(text: str, i: int) -> tuple[str, int]:
    """The character the C escape at text[i] (after the backslash) stands for, and the index
    after it: cunescape_one() (src/basic/escape.c), without its NUL."""
    c = text[i : i + 1]
    if c in _C_ESCAPES:
        return _C_ESCAPES[c], i + 1
    digits = {"x": 2, "u": 4, "U": 8}.get(c)
    if digits is not None:
        code = text[i + 1 : i + 1 + digits]
        if len(code) == digits and all(d in "0123456789abcdefABCDEF" for d in code):
            value = int(code, 16)
            if value and value < 0x110000 and not 0xD800 <= value < 0xE000:
                return chr(value), i + 1 + digits
    elif c in "01234567":
        code = text[i : i + 3]
        if len(code) == 3 and all(d in "01234567" for d in code) and int(code, 8):
            return chr(int(code, 8)), i + 3
    raise InvalidValue(f"bad escape \\{c}" if c else "trailing backslash")


def next_word(
    text: str, i: int, *, unquote: bool, retain_escape: bool, cunescape: bool = False
) -> tuple[str, int] | None:
    """The word at or after `i`, and the index after it; None when only whitespace is left.

    extract_first_word() (src/basic/extract-word.c): words are separated by whitespace;
    `unquote` removes '...' and "..." quoting (EXTRACT_UNQUOTE); without `retain_escape` a
    backslash takes the next character literally, with it backslashes are kept as written;
    `cunescape` makes a backslash start a C escape instead, inside quotes and out
    (EXTRACT_CUNESCAPE).
    """
    i = skip_whitespace(text, i)
    if i == len(text):
        return None
    word: list[str] = []
    quote = ""
    while i < len(text):
        c = text[i]
        if c == "\\" and cunescape:
            char, i = _cunescape_one(text, i + 1)
            word.append(char)
            continue
        if c == "\\" and not retain_escape:
            i += 1
            if i == len(text):
                raise InvalidValue("trailing backslash")
            word.append(text[i])
        elif quote:
            if c == quote:
                quote = ""
            else:
                word.append(c)
        elif c in WHITESPACE:
            break
        elif unquote and c in "'\"":
            quote = c
        else:
            word.append(c)
        i += 1
    if quote:
        raise InvalidValue("unbalanced quotes")
    return "".join(word), i


def split_words(
    text: str, *, unquote: bool, retain_escape: bool, cunescape: bool = False
) -> list[str]:
    """All words of `text`, see next_word()."""
    words: list[str] = []
    i = 0
    while (
        found := next_word(
            text, i, unquote=unquote, retain_escape=retain_escape, cunescape=cunescape
        )
    ) is not None:
        word, i = found
        words.append(word)
    return words


def expand_specifiers(text: str) -> str:
    """`%%` -> `%`. Other specifiers have no meaning in a transient unit, so they are refused."""
    m = re.search(r"%(?!%)", text.replace("%%", ""))
    if m:
        spec = text.replace("%%", "")[m.start() : m.start() + 2]
        raise InvalidValue(
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
        raise InvalidValue(
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
    raise InvalidValue(
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
            raise InvalidValue(f"{path!r} names no device group", accepted)
    if any(c in WHITESPACE for c in path):
        raise InvalidValue(f"{path!r} contains whitespace", accepted)
    parts = path.split("/")
    normalized = (
        path.startswith(("/dev/", "/run/systemd/inaccessible/"))
        and not path.endswith("/")
        and all(part not in ("", ".", "..") for part in parts[1:])
    )
    if not normalized:
        raise InvalidValue(f"{path!r} is not a device node path", accepted)
    if re.fullmatch(r"/dev/(char|block)/.*", path) and not re.fullmatch(
        r"/dev/(char|block)/[0-9]+:[0-9]+", path
    ):
        raise InvalidValue(f"{path!r}: /dev/char/ and /dev/block/ hold MAJOR:MINOR names", accepted)
    return path


def parse_device_allow(value: str) -> list[object]:
    """config_parse_device_allow(): a path (quotes allowed), then the rights r, w, m."""
    found = next_word(value, 0, unquote=True, retain_escape=False)
    assert found is not None  # value is not empty and starts with a non-space
    path = check_device_path(found[0])
    rights = value[skip_whitespace(value, found[1]) :]
    if not re.fullmatch(r"[rwm]*", rights):
        raise InvalidValue(f"rights {rights!r} are not a combination of r, w and m")
    # An empty string means "rwm" to the manager; systemd-run sends it as written.
    return [(path, rights)]
