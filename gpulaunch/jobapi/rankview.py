"""One rank as the job API shows it: the bus's `(iisusiibid)` struct (plus `RankEnds`), an
object in the record's JSON; `RankExit` (model.py) is what it carries, placeholders (-1, 0)
only at the bus.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpulaunch.model import (
    OomKill,
    RankExit,
    RankProgress,
    RankResult,
    RankState,
    RankUsage,
    StepInfo,
)

RANK_SIGNATURE = "(iisusiibid)"
RANK_END_SIGNATURE = "(ibxxs)"  # RankView.end_wire


@dataclass(frozen=True)
class RankView:
    """One rank: the `(iisusiibid)` struct on the bus, an object in the record's JSON.

    `pid` is 0 before the rank was forked; `exit_code` is -1 and `signal` 0
    unless it exited that way; `status` (the shell's view: code or 128+N) is -1
    while it runs; `runtime` is 0.0 while it runs.
    """

    rank: int
    local_rank: int
    unit: str
    pid: int
    state: str
    exit_code: int
    signal: int
    stopped_by_watcher: bool
    status: int
    runtime: float
    # Not in the bus's Ranks struct (it is fixed): usage in the record's JSON and the
    # report; oom and core_dumped also in the bus's RankEnds (`end_wire`).
    usage: RankUsage | None = None
    oom: OomKill | None = None
    core_dumped: bool = False
    # What it said through the progress channel (below: the bus's `Steps`, the JSON).
    steps: StepInfo | None = None
    status_text: str = ""

    def end_wire(self) -> list[Any] | None:
        """What the Ranks struct lacks of how it ended: `(ibxxs)` rank, core dumped, the OOM
        kill's memory and limit (-1: unknown) and source ("": no OOM kill); None: nothing."""
        if not self.core_dumped and self.oom is None:
            return None
        oom = self.oom or OomKill(None, None, "")
        return [
            self.rank,
            self.core_dumped,
            -1 if oom.memory is None else oom.memory,
            -1 if oom.limit is None else oom.limit,
            oom.source,
        ]

    def with_end(self, wire: Sequence[Any]) -> RankView:
        """This rank with its `end_wire()` from the bus."""
        _, core, memory, limit, source = wire
        oom = OomKill(
            None if memory < 0 else int(memory), None if limit < 0 else int(limit), source
        )
        return dataclasses.replace(self, core_dumped=bool(core), oom=oom if source else None)

    def wire(self) -> list[Any]:
        return [
            self.rank,
            self.local_rank,
            self.unit,
            self.pid,
            self.state,
            self.exit_code,
            self.signal,
            self.stopped_by_watcher,
            self.status,
            self.runtime,
        ]

    @classmethod
    def from_wire(cls, item: Sequence[Any]) -> RankView:
        rank, local, unit, pid, state, code, sig, stopped, status, runtime = item
        return cls(
            rank=int(rank),
            local_rank=int(local),
            unit=str(unit),
            pid=int(pid),
            state=str(state),
            exit_code=int(code),
            signal=int(sig),
            stopped_by_watcher=bool(stopped),
            status=int(status),
            runtime=float(runtime),
        )

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> RankView:
        view = cls.from_wire([_UNSET.get(f) if obj[f] is None else obj[f] for f in _RANK_FIELDS])
        usage, oom = obj.get("usage"), obj.get("oom")
        return dataclasses.replace(
            view,
            usage=RankUsage(**usage) if isinstance(usage, dict) else None,
            oom=OomKill(**oom) if isinstance(oom, dict) else None,
            core_dumped=bool(obj.get("core_dumped", False)),
            steps=steps_from_json(obj.get("steps")),
            status_text=str(obj.get("status_text") or ""),
        )

    @classmethod
    def of_progress(cls, rank: RankProgress) -> RankView:
        ex = rank.exit
        return cls(
            rank=rank.rank,
            local_rank=rank.local_rank,
            unit=rank.unit,
            pid=rank.pid or 0,
            state=rank.state.value,
            exit_code=-1 if ex is None or ex.code is None else ex.code,
            signal=0 if ex is None or ex.signal is None else ex.signal,
            stopped_by_watcher=ex.stopped_by_watcher if ex is not None else rank.stop_requested,
            status=-1 if ex is None else ex.status,
            runtime=0.0 if ex is None else ex.runtime,
            usage=None if ex is None else ex.usage,
            oom=None if ex is None else ex.oom,
            core_dumped=ex is not None and ex.core_dumped,
            steps=rank.steps,
            status_text=rank.status_text or "",
        )

    def result(self) -> RankResult:
        """Back to the report's form (for `format_report`)."""
        ended = self.state in (RankState.EXITED, RankState.STOPPED)
        return RankResult(
            rank=self.rank,
            unit=self.unit,
            pid=self.pid or None,
            exit=RankExit(
                code=self.exit_code if self.exit_code >= 0 else None,
                signal=self.signal or None,
                stopped_by_watcher=self.stopped_by_watcher,
                observed_at=0.0,
                runtime=self.runtime,
                core_dumped=self.core_dumped,
                usage=self.usage,
                oom=self.oom,
            )
            if ended
            else None,
        )


_RANK_FIELDS = tuple(RankView.__dataclass_fields__)[:10]  # the wire struct's


def with_ends(ranks: Sequence[RankView], ends: Sequence[Sequence[Any]]) -> tuple[RankView, ...]:
    """`ranks` with how they ended from the bus's `RankEnds` (`RankView.end_wire`)."""
    by_rank = {int(e[0]): e for e in ends}
    return tuple(r.with_end(by_rank[r.rank]) if r.rank in by_rank else r for r in ranks)


# The bus's "not (yet) known" values of a rank; JSON says null instead.
_UNSET: dict[str, Any] = {"pid": 0, "exit_code": -1, "signal": 0, "status": -1, "runtime": 0.0}


def ranks_json(rank: RankView) -> dict[str, Any]:
    """A rank as JSON: null where the bus has a placeholder (a running rank's exit)."""
    out = {f: getattr(rank, f) for f in _RANK_FIELDS}
    ended = rank.state in (RankState.EXITED, RankState.STOPPED)
    for f, unset in _UNSET.items():
        if out[f] == unset and (f == "pid" or not ended or f in ("exit_code", "signal")):
            out[f] = None
    out["usage"] = None if rank.usage is None else dataclasses.asdict(rank.usage)
    out["oom"] = None if rank.oom is None else dataclasses.asdict(rank.oom)
    out["core_dumped"] = rank.core_dumped
    out["steps"] = steps_json(rank.steps, live=not ended)
    out["status_text"] = rank.status_text or None
    return out


# -- what ranks said of their steps (gpulaunch/progress/, docs/progress.md) -----------
#
# `at`, the time of a rank's last step, is the watcher's CLOCK_MONOTONIC: one clock for the
# whole machine, so a reader on it computes the seconds since then itself.

# rank, step, total (-1: unknown), at (monotonic seconds), steps per second (-1: unknown),
# seconds of one step (-1: unknown), straggler now, times flagged, its last STATUS=
STEPS_SIGNATURE = "(ixxdddbus)"


def steps_wire(rank: RankView) -> list[Any] | None:
    """The rank's `Steps` entry; None where it said nothing."""
    s = rank.steps
    if s is None and not rank.status_text:
        return None
    if s is None:
        return [rank.rank, -1, -1, 0.0, -1.0, -1.0, False, 0, rank.status_text]
    return [
        rank.rank,
        s.step,
        -1 if s.total is None else s.total,
        s.at,
        -1.0 if s.steps_per_second is None else s.steps_per_second,
        -1.0 if s.step_seconds is None else s.step_seconds,
        s.straggler,
        s.straggled,
        rank.status_text,
    ]


def from_wire(wire: Sequence[Any]) -> tuple[int, StepInfo | None, str]:
    """A `Steps` entry: its rank, its steps (None: it reported none) and its status text."""
    rank, step, total, at, rate, seconds, straggler, straggled, text = wire
    if step < 0:
        return int(rank), None, str(text)
    info = StepInfo(
        step=int(step),
        total=None if total < 0 else int(total),
        at=float(at),
        steps_per_second=None if rate < 0 else float(rate),
        step_seconds=None if seconds < 0 else float(seconds),
        straggler=bool(straggler),
        straggled=int(straggled),
    )
    return int(rank), info, str(text)


def steps_json(steps: StepInfo | None, live: bool) -> dict[str, Any] | None:
    """A rank's `steps` in JSON; `seconds_since_step` only while the job runs."""
    if steps is None:
        return None
    return {
        "step": steps.step,
        "total": steps.total,
        "steps_per_second": steps.steps_per_second,
        "step_seconds": steps.step_seconds,
        "seconds_since_step": max(0.0, time.monotonic() - steps.at) if live else None,
        "eta_seconds": steps.eta_seconds() if live else None,
        "straggler": steps.straggler,
        "straggled": steps.straggled,
        "at_monotonic": steps.at,
    }


def steps_from_json(obj: Mapping[str, Any] | None) -> StepInfo | None:
    if not isinstance(obj, Mapping):
        return None
    return StepInfo(
        step=int(obj["step"]),
        total=obj.get("total"),
        at=float(obj.get("at_monotonic", 0.0)),
        steps_per_second=obj.get("steps_per_second"),
        step_seconds=obj.get("step_seconds"),
        straggler=bool(obj.get("straggler", False)),
        straggled=int(obj.get("straggled", 0)),
    )


def with_steps(ranks: Sequence[RankView], wire: Sequence[Sequence[Any]]) -> tuple[RankView, ...]:
    """`ranks` with what the bus's `Steps` says of them."""
    said = {rank: (info, text) for rank, info, text in map(from_wire, wire)}
    return tuple(
        dataclasses.replace(r, steps=said[r.rank][0], status_text=said[r.rank][1])
        if r.rank in said
        else r
        for r in ranks
    )
