"""Job ids and the unit names derived from them.

A `-` in a slice name means nesting (`a-b.slice` lives in `a.slice`), so a job
id is escaped before it becomes part of a unit name: every byte outside
`[A-Za-z0-9_.:]` becomes `\\xNN`, like `systemd-escape` does, except that `/`
is escaped too (plain `systemd-escape` maps it to `-`, which would make `a/b`
and `a-b` collide). See systemd.unit(5), "String Escaping for Inclusion in
Unit Names".
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

PREFIX = "gpulaunch"
ROOT_SLICE = f"{PREFIX}.slice"

# Unit names are limited to 255 bytes (UNIT_NAME_MAX). The longest name we
# derive is "gpulaunch-<job>-rank<N>.scope"; keep room for 7-digit ranks.
_MAX_ESCAPED = 255 - len(f"{PREFIX}--rank9999999.scope")
_SAFE = re.compile(rb"[A-Za-z0-9_.:]")


def escape(job: str) -> str:
    """Escape a job id into a unit-name component without nesting or collisions."""
    raw = job.encode("utf-8", "surrogateescape")
    out = []
    for i, byte in enumerate(raw):
        char = bytes([byte])
        if _SAFE.fullmatch(char) and not (i == 0 and char == b"."):
            out.append(char.decode())
        else:
            out.append(f"\\x{byte:02x}")
    escaped = "".join(out)
    if len(escaped) > _MAX_ESCAPED:
        # Keep a readable head and make the rest unique by hashing the whole id.
        digest = hashlib.sha256(raw).hexdigest()[:16]
        head = escaped[: _MAX_ESCAPED - len(digest) - 1]
        head = head[: head.rfind("\\")] if "\\" in head[-3:] else head  # never cut an escape
        escaped = f"{head}_{digest}"
    return escaped


def validate_job_id(job: str) -> str | None:
    """Return why `job` is not acceptable as a job id, or None if it is."""
    if not job:
        return "the job id is empty"
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in job):
        return "the job id contains control characters"
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
    def job_slice(self) -> str:
        return f"{PREFIX}-{self.component}.slice"

    @property
    def ranks_slice(self) -> str:
        return f"{PREFIX}-{self.component}-ranks.slice"

    @property
    def watcher_scope(self) -> str:
        return f"{PREFIX}-{self.component}-watcher.scope"

    def rank_scope(self, rank: int) -> str:
        return f"{PREFIX}-{self.component}-rank{rank}.scope"
