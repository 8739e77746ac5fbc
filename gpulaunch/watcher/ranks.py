"""The live record of one rank, as the watcher's loop keeps it."""

from __future__ import annotations

from dataclasses import dataclass

from gpulaunch.model import RankExit, RankProgress, RankSpec, RankState, check_transition
from gpulaunch.watcher.procs import HeldChild


@dataclass
class Rank:
    """The live record of one rank; only the watcher's loop changes it."""

    spec: RankSpec
    state: RankState = RankState.PENDING
    child: HeldChild | None = None
    pump: HeldChild | None = None  # copies the rank's output to journald and to us
    in_scope: bool = False  # systemd finished moving it (and its pump) into its scope
    born_at: float = 0.0
    stop_requested: bool = False
    exit: RankExit | None = None
    journal_missed: bool = False  # its pump could not hand journald every line

    def advance(self, new: RankState) -> None:
        check_transition(self.state, new)
        self.state = new

    def progress(self) -> RankProgress:
        return RankProgress(
            rank=self.spec.rank,
            local_rank=self.spec.local_rank,
            unit=self.spec.unit,
            state=self.state,
            pid=self.child.pid if self.child is not None else None,
            stop_requested=self.stop_requested,
            exit=self.exit,
        )
