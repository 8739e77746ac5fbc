"""What rendering produces: one unit's definition, and every unit of one job.

Plain data, so that a supervisor can take a job's units without loading the
templates, the sandbox or the codec's parser.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from gpulaunch.units.codec import Property


@dataclass(frozen=True)
class UnitDefinition:
    """One rendered unit: what `gpulaunch render` prints and what systemd is asked to create."""

    name: str
    template: Path
    text: str
    properties: tuple[Property, ...]


@dataclass(frozen=True)
class LaunchSetup:
    """What the front end gives its watcher service (units/launch.service) from its own
    process: known only where it runs."""

    exec_start: tuple[str, ...]  # the watcher's command line
    working_directory: str
    environment: tuple[str, ...]  # NAME=VALUE
    limits: tuple[tuple[str, int, int], ...]  # (NAME, soft, hard) as getrlimit(); -1: infinity
    bus_name: str | None  # the front end's bus name; None: --detach


@dataclass(frozen=True)
class JobUnits:
    """The rendered definitions of every unit of one job.

    `anchor` and `launch` render the units whose variables are known only later, from the
    same templates: the anchor for the watcher's pid (after a --detach fork), the front end's
    service from the front end's own process.
    """

    job: str
    job_slice: UnitDefinition
    ranks_slice: UnitDefinition
    watcher: UnitDefinition
    ranks: tuple[UnitDefinition, ...]  # in the spec's rank order
    anchor: Callable[[int], UnitDefinition]
    launch: Callable[[LaunchSetup], UnitDefinition]
    tie: Callable[[int], UnitDefinition]  # for the front end's pid (no user bus)

    def all(self) -> Sequence[UnitDefinition]:
        return (self.job_slice, self.watcher, self.ranks_slice, *self.ranks)
