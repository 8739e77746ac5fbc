"""The doctor's vocabulary: a `Finding` (one row), its `Status`, and the `Machine` the
checks read (its paths, its user, its limits), so that tests run them on a fake tree."""

from __future__ import annotations

import enum
import os
import pwd
import resource
from dataclasses import dataclass, field
from pathlib import Path

from gpulaunch.model import Manager


class Status(enum.StrEnum):
    """How a finding bears on a job: fail means a job cannot run here."""

    OK = "ok"
    INFO = "info"  # a fact, nothing to fix (e.g. no GPU on a CPU machine)
    WARN = "warn"  # a job runs, but something is off, or accepted and not enforced
    FAIL = "fail"  # a job cannot run here


@dataclass(frozen=True)
class Finding:
    """One row of the doctor's table."""

    area: str
    item: str
    status: Status
    detail: str
    fix: str = ""


@dataclass(frozen=True)
class Machine:
    """The machine as the checks see it; `Machine.here()` is this one."""

    manager: Manager  # the manager a job gets by default (root: system, others: user)
    uid: int
    root: Path = Path("/")
    env: dict[str, str] = field(default_factory=dict)
    nofile: tuple[int, int] = (1024, 1024)  # soft, hard

    @classmethod
    def here(cls, manager: Manager) -> Machine:
        return cls(
            manager=manager,
            uid=os.geteuid(),
            env=dict(os.environ),
            nofile=resource.getrlimit(resource.RLIMIT_NOFILE),
        )

    def path(self, absolute: str) -> Path:
        return self.root / absolute.lstrip("/")

    @property
    def user(self) -> str:
        try:
            return pwd.getpwuid(self.uid).pw_name
        except KeyError:
            return str(self.uid)
