"""What rendering produces: one unit's definition, and every unit of one job.

Plain data, so that a supervisor can take a job's units without loading the
templates, the sandbox or the codec's parser.
"""

from __future__ import annotations

from collections.abc import Sequence
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
class JobUnits:
    """The rendered definitions of every unit of one job."""

    job: str
    job_slice: UnitDefinition
    ranks_slice: UnitDefinition
    watcher: UnitDefinition
    ranks: tuple[UnitDefinition, ...]  # in the spec's rank order

    def all(self) -> Sequence[UnitDefinition]:
        return (self.job_slice, self.watcher, self.ranks_slice, *self.ranks)
