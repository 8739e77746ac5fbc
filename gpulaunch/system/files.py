"""The files the package ships for the system side, and where `gpulaunch setup` puts them.

They live in the repository's top-level `packaging/`, which a wheel carries as package data
(`gpulaunch.shipped`): a user who installed gpulaunch with pip has no repository to copy
them from.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from pathlib import Path

from gpulaunch.shipped import packaging_dir

DATA = packaging_dir()


class Piece(enum.StrEnum):
    """An optional part of the system side; a job runs without any of them."""

    BUS_POLICY = "bus-policy"  # lets a system job's watcher own io.gpulaunch.job.* (docs/dbus.md)
    JOURNALD = "journald"  # journald keeps every line of chatty ranks
    SLICE = "slice"  # gpulaunch.slice: the settings an admin tunes for all jobs together
    RUNTIME_DIR = "runtime-dir"  # /run/gpulaunch at boot (tmpfiles.d)


@dataclass(frozen=True)
class SystemFile:
    """A shipped file and the path `setup` installs it at (relative to the root, `/`)."""

    piece: Piece
    source: Path
    target: str  # absolute, as on the machine

    def at(self, root: Path) -> Path:
        """Where it goes under `root` (`/` for the machine itself)."""
        return root / self.target.lstrip("/")

    def installed(self, root: Path = Path("/")) -> bool:
        """True when the target holds exactly what this package ships."""
        try:
            return self.at(root).read_bytes() == self.source.read_bytes()
        except OSError:
            return False


BUS_POLICY = SystemFile(
    Piece.BUS_POLICY, DATA / "dbus" / "io.gpulaunch.conf", "/etc/dbus-1/system.d/io.gpulaunch.conf"
)
JOURNALD_DROP_IN = SystemFile(
    Piece.JOURNALD,
    DATA / "journald" / "60-gpulaunch.conf",
    "/etc/systemd/journald.conf.d/60-gpulaunch.conf",
)
SYSTEM_SLICE = SystemFile(
    Piece.SLICE, DATA / "systemd" / "gpulaunch.slice", "/etc/systemd/system/gpulaunch.slice"
)
USER_SLICE = SystemFile(
    Piece.SLICE, DATA / "systemd" / "gpulaunch.slice", "/etc/systemd/user/gpulaunch.slice"
)
TMPFILES = SystemFile(
    Piece.RUNTIME_DIR, DATA / "tmpfiles.d" / "gpulaunch.conf", "/etc/tmpfiles.d/gpulaunch.conf"
)
# What a plain `gpulaunch setup` installs; the journald drop-in only with --journald.
DEFAULT = (BUS_POLICY, SYSTEM_SLICE, USER_SLICE, TMPFILES)
ALL = (*DEFAULT, JOURNALD_DROP_IN)

# The one command that turns each piece on (messages name it; `setup` does it).
FIX = {
    Piece.BUS_POLICY: "sudo gpulaunch setup",
    Piece.JOURNALD: "sudo gpulaunch setup --journald --restart-journald",
    Piece.SLICE: "sudo gpulaunch setup",
    Piece.RUNTIME_DIR: "sudo gpulaunch setup",
}
