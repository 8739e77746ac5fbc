"""The live record of one rank, as the watcher's loop keeps it."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from gpulaunch.base.cgroup import cgroup_of
from gpulaunch.base.procs import HeldChild, WaitStatus, kill_held
from gpulaunch.model import (
    OomKill,
    RankExit,
    RankProgress,
    RankSpec,
    RankState,
    RankUsage,
    StepInfo,
    check_transition,
)


@dataclass
class Rank:
    """The live record of one rank; only the watcher's loop changes it."""

    spec: RankSpec
    state: RankState = RankState.PENDING
    child: HeldChild | None = None
    pump: HeldChild | None = None  # copies the rank's output to journald and to us
    in_scope: bool = False  # systemd finished moving it (and its pump) into its scope
    cgroup: Path | None = None  # its scope's cgroup, read when its gate opens (resources/)
    born_at: float = 0.0
    stop_requested: bool = False
    error_at: float | None = None  # when its @record wrote its error file (watcher/errorwatch.py)
    exit: RankExit | None = None
    journal_missed: bool = False  # its pump could not hand journald every line
    journal_crowded: bool = False  # its pump left lines out: journald was slower than the rank
    pump_hold: int = -1  # write end of the pipe its pump waits on before exiting
    units: bool = True  # its supervisor makes units (systemd); the direct one makes none
    steps: StepInfo | None = None  # what it said of its steps (gpulaunch/progress/)
    status_text: str | None = None  # its last STATUS= (gpulaunch/progress/)

    @property
    def unit(self) -> str:
        """Its scope's name where units exist, else "" (never a unit that does not exist)."""
        return self.spec.unit if self.units else ""

    def hold_pump(self) -> int:
        """A new hold for its (next) pump; returns the read end, for the pump."""
        self.let_pump_go()  # a restart: the last attempt's pump may go
        hold, self.pump_hold = os.pipe()
        return hold

    def let_pump_go(self) -> None:
        """Let its pump exit once its input is done (it waits for this pipe's EOF): until
        then the pump keeps the rank's scope, and so its cgroup's counters, in place."""
        if self.pump_hold >= 0:
            os.close(self.pump_hold)
            self.pump_hold = -1

    def release(self) -> None:
        """Open its gates (rank and pump), noting its scope's cgroup first: a zombie's
        /proc/PID/cgroup no longer names it, and the report reads it at the end.

        A cgroup it shares with the watcher (process groups: a login session's
        scope, a Slurm step) is not its own: none then, and its figures come from
        its own processes (wait4), never the shared cgroup's."""
        assert self.child is not None and self.pump is not None
        group = cgroup_of(self.child.pid)
        # The watcher's own cgroup is not the rank's (process groups: a container's or a
        # login's, shared by every rank): its counters are not this rank's.
        self.cgroup = group if group != cgroup_of(os.getpid()) else None
        self.pump.release()
        self.child.release()

    def kill_if_held(self) -> None:
        """A rank still at its gate never ran user code: nothing to be graceful about."""
        if self.state is RankState.HELD and self.child is not None:
            for child in (self.child, self.pump):
                if child is not None:
                    child.abandon()
                    kill_held(child)

    def ended(
        self, status: WaitStatus, now: float, usage: RankUsage, oom: OomKill | None
    ) -> RankExit:
        """How it ended, reaped `now`: its failure counts from when its @record wrote its
        error file, if it did and the watcher had not asked it to stop."""
        return RankExit(
            code=status.code,
            signal=status.signal,
            stopped_by_watcher=self.stop_requested,
            observed_at=now if self.error_at is None or self.stop_requested else self.error_at,
            runtime=now - self.born_at,
            core_dumped=status.core_dumped,
            usage=usage,
            oom=oom,
        )

    def advance(self, new: RankState) -> None:
        check_transition(self.state, new)
        self.state = new

    def progress(self) -> RankProgress:
        return RankProgress(
            rank=self.spec.rank,
            local_rank=self.spec.local_rank,
            unit=self.unit,
            state=self.state,
            pid=self.child.pid if self.child is not None else None,
            stop_requested=self.stop_requested,
            exit=self.exit,
            steps=self.steps,
            status_text=self.status_text,
        )


def let_pumps_go(ranks: list[Rank]) -> None:
    for rank in ranks:
        rank.let_pump_go()
