"""One rank as the job API shows it: the bus's `(iisusiibid)` struct (plus `RankEnds`), an
object in the record's JSON; `RankExit` (model.py) is what it carries, placeholders (-1, 0)
only at the bus.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpulaunch.model import OomKill, RankExit, RankProgress, RankResult, RankState, RankUsage

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
    return out
