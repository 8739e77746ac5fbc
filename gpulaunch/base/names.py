"""Job ids and the unit names derived from them.

A `-` in a slice name means nesting (`a-b.slice` lives in `a.slice`), so a job
id is escaped before it becomes part of a unit name: every byte outside
`[A-Za-z0-9_.:]` becomes `\\xNN`, like `systemd-escape` does, except that `/`
is escaped too (plain `systemd-escape` maps it to `-`, which would make `a/b`
and `a-b` collide). See systemd.unit(5), "String Escaping for Inclusion in
Unit Names".

Distinct job ids always get distinct names. Escaping byte by byte is
injective, and a job id whose escaped form would not fit (or that is no
string argv could give) gets a hashed form instead: a readable head, `_`, and
hex digits of a hash of the whole id, exactly `HASHED_LENGTH` characters long.
An escaped id is used only when it is shorter than that, so no escaped id can
spell a hashed form (issue 13, item 11).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

PREFIX = "gpulaunch"
ROOT_SLICE = f"{PREFIX}.slice"

# Unit names are limited to 255 bytes (UNIT_NAME_MAX). The longest name we
# derive is "gpulaunch-<job>-rank<N>.scope"; keep room for 7-digit ranks.
HASHED_LENGTH = 255 - len(f"{PREFIX}--rank9999999.scope")
_MIN_DIGEST = 32  # hex digits: 128 bits of the hash, at least
_SAFE = re.compile(rb"[A-Za-z0-9_.:]")


def _escape_bytes(raw: bytes) -> str:
    out = []
    for i, byte in enumerate(raw):
        char = bytes([byte])
        if _SAFE.fullmatch(char) and not (i == 0 and char == b"."):
            out.append(char.decode())
        else:
            out.append(f"\\x{byte:02x}")
    return "".join(out)


def _argv_bytes(job: str) -> bytes | None:
    """The bytes `job` was decoded from (argv, environ: UTF-8, surrogateescape), or None.

    A string that no bytes decode to (a surrogate not from surrogateescape, or
    surrogates spelling valid UTF-8) has none: encoding it would collide with
    another id.
    """
    try:
        raw = job.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return None
    return raw if raw.decode("utf-8", "surrogateescape") == job else None


def escape(job: str) -> str:
    """Escape a job id into a unit-name component: no nesting, never the same for two ids."""
    raw = _argv_bytes(job)
    escaped = _escape_bytes(raw if raw is not None else job.encode("utf-8", "surrogatepass"))
    if raw is not None and len(escaped) < HASHED_LENGTH:
        return escaped
    # Keep a readable head; the hash of the whole id (surrogatepass: one encoding for every
    # string) fills the rest, so that the name is exactly HASHED_LENGTH characters long.
    head = escaped[: HASHED_LENGTH - _MIN_DIGEST - 1]
    cut = head.rfind("\\")
    if cut >= 0 and cut > len(head) - 4:  # never cut an escape (4 characters) in half
        head = head[:cut]
    digits = HASHED_LENGTH - len(head) - 1
    digest = hashlib.shake_256(job.encode("utf-8", "surrogatepass")).hexdigest((digits + 1) // 2)
    return f"{head}_{digest[:digits]}"


def validate_job_id(job: str) -> str | None:
    """Return why `job` is not acceptable as a job id, or None if it is."""
    if not job:
        return "the job id is empty"
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in job):
        return "the job id contains control characters"
    try:
        job.encode("utf-8")
    except UnicodeEncodeError:
        # It names D-Bus objects, unit descriptions and journal fields, which are UTF-8.
        return "the job id is not valid UTF-8; give it as UTF-8 text"
    return None


@dataclass(frozen=True)
class UnitNames:
    """The names of every unit of one job (docs/architecture.md, "The units of a job")."""

    job: str
    component: str

    @classmethod
    def for_job(cls, job: str) -> UnitNames:
        return cls(job=job, component=escape(job))

    @property
    def stem(self) -> str:
        """`gpulaunch-<escaped job>`: every name of the job starts with it (the direct
        supervisor's cgroup is named this)."""
        return f"{PREFIX}-{self.component}"

    @property
    def job_slice(self) -> str:
        return f"{self.stem}.slice"

    @property
    def ranks_slice(self) -> str:
        return f"{self.stem}-ranks.slice"

    @property
    def watcher_scope(self) -> str:
        return f"{self.stem}-watcher.scope"

    @property
    def anchor_service(self) -> str:
        return f"{self.stem}-anchor.service"

    @property
    def launch_service(self) -> str:
        return f"{self.stem}-launch.service"

    @property
    def tie_service(self) -> str:
        return f"{self.stem}-tie.service"

    def rank_scope(self, rank: int) -> str:
        return f"{self.stem}-rank{rank}.scope"


# The job API's names on D-Bus (gpulaunch/jobapi/): the job id escaped for a bus name
# and an object path.
NAME_PREFIX = "io.gpulaunch.job"
PATH_PREFIX = "/io/gpulaunch/job"

_BUS_NAME_MAX = 255
_LABEL_MAX = _BUS_NAME_MAX - len(NAME_PREFIX) - 1
_PLAIN = re.compile(rb"[A-Za-z0-9]")


def bus_label(job: str) -> str:
    """Escape a job id into one bus-name element / object-path element."""
    raw = job.encode("utf-8", "surrogateescape")
    out = []
    for i, byte in enumerate(raw):
        char = bytes([byte])
        if _PLAIN.fullmatch(char) and not (i == 0 and char.isdigit()):
            out.append(char.decode())
        else:
            out.append(f"_{byte:02x}")
    label = "".join(out) or "_"
    if len(label) > _LABEL_MAX:
        digest = hashlib.sha256(raw).hexdigest()[:32]
        head = label[: _LABEL_MAX - len(digest) - 2]
        cut = head.rfind("_")
        if cut >= len(head) - 2:  # never cut an escape in half
            head = head[:cut]
        label = f"{head}_h{digest}"
    return label


def bus_name(job: str) -> str:
    """The well-known name a job's watcher owns: `io.gpulaunch.job.<label>`."""
    return f"{NAME_PREFIX}.{bus_label(job)}"


def object_path(job: str) -> str:
    """The job's object: `/io/gpulaunch/job/<label>`."""
    return f"{PATH_PREFIX}/{bus_label(job)}"


def is_job_name(name: str) -> bool:
    return name.startswith(NAME_PREFIX + ".")


SYSTEMD_UNIT_PATH = "/org/freedesktop/systemd1/unit/"


def unit_object_path(unit: str) -> str:
    """systemd's object path of a unit (sd_bus_path_encode's escaping)."""
    out = []
    for i, byte in enumerate(unit.encode()):
        char = chr(byte)
        if char.isascii() and (char.isalpha() or (char.isdigit() and i > 0)):
            out.append(char)
        else:
            out.append(f"_{byte:02x}")
    return SYSTEMD_UNIT_PATH + ("".join(out) or "_")
