"""A job as seen from outside: its names on the bus, and the one record shape it has
on the bus, in its journal record and in `gpulaunch status` (docs/dbus.md).

Pure data and functions: no bus, no journal.

Bus names and object paths admit only `[A-Za-z0-9_]` in a label (and a bus name
label must not begin with a digit), so a job id is escaped like systemd's
`bus_label_escape`: every other byte becomes `_XX` (two lowercase hex digits),
and a leading digit is escaped too. Over-long labels keep a readable head and
end in `_h` plus a hash of the whole id (`_h` never occurs in an escaped label).
"""

from __future__ import annotations

import dataclasses
import enum
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpulaunch.base.names import NAME_PREFIX as NAME_PREFIX  # the names' home: base/names.py
from gpulaunch.base.names import PATH_PREFIX as PATH_PREFIX
from gpulaunch.base.names import bus_label as bus_label
from gpulaunch.base.names import bus_name as bus_name
from gpulaunch.base.names import is_job_name as is_job_name
from gpulaunch.base.names import object_path as object_path
from gpulaunch.base.protocol import Layout, NodeFailure, NodeInfo, RoundEnd
from gpulaunch.jobapi.rankview import (  # RankView's home; also importable from here
    RANK_END_SIGNATURE as RANK_END_SIGNATURE,
)
from gpulaunch.jobapi.rankview import RANK_SIGNATURE as RANK_SIGNATURE
from gpulaunch.jobapi.rankview import STEPS_SIGNATURE, steps_wire, with_ends, with_steps
from gpulaunch.jobapi.rankview import RankView as RankView
from gpulaunch.jobapi.rankview import ranks_json as ranks_json
from gpulaunch.jobapi.wire import (
    GOODPUT_SIGNATURE,
    NODE_SIGNATURE,
    PHASES_SIGNATURE,
    goodput_from_wire,
    goodput_wire,
    node_from_wire,
    node_wire,
    phases_from_wire,
    phases_wire,
)
from gpulaunch.model import (
    AttemptPhases,
    Carried,
    Cause,
    Goodput,
    GpuUse,
    JobProgress,
    JobReport,
    LogDrop,
    Manager,
    Phase,
)

INTERFACE = "io.gpulaunch.Job1"
# `Manager` of a job no systemd manager holds (the direct supervisor); its `Slice` is then
# where its ranks are: its cgroup's path, or "process groups"
NO_MANAGER = "none"
PROCESS_GROUPS = "process groups"


def bus_title(manager: Manager) -> str:
    """Where a job of this manager is published, in words."""
    from gpulaunch.jobapi import whose

    other = whose.other()
    if manager is Manager.USER and other is not None:
        return f"{other.name}'s session bus"
    return "the system bus" if manager is Manager.SYSTEM else "your session bus"


class JobState(enum.StrEnum):
    """The job's life, spelled the same in `list`, `status`, the record and the bus.

    ::

        starting -> running -> stopping -> succeeded | failed | stopped

    `stopped`: someone stopped it (`gpulaunch stop`, Ctrl-C, a signal to the
    watcher) before anything failed, or it was preempted (--preempt-grace);
    `failed`: a rank or another node failed, or it could not start.
    """

    STARTING = "starting"
    RUNNING = "running"
    STOPPING = "stopping"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"

    @property
    def ended(self) -> bool:
        return self in (JobState.SUCCEEDED, JobState.FAILED, JobState.STOPPED)

    @classmethod
    def of_cause(cls, cause: Cause, status: int) -> JobState:
        """How a job that ended with `cause` and `status` is called."""
        if cause is Cause.SUCCEEDED and status == 0:
            return cls.SUCCEEDED
        if cause in (Cause.INTERRUPTED, Cause.PREEMPTED):
            return cls.STOPPED
        return cls.FAILED

    @classmethod
    def of_report(cls, report: JobReport) -> JobState:
        return cls.of_cause(report.cause, report.status)


def _cause_rank(report: JobReport | None, failure: NodeFailure | None) -> int:
    """The job's cause rank: this node's, or (node-failed) the other node's global rank."""
    if report is None:
        return -1
    if report.cause is Cause.NODE_FAILED:
        return -1 if failure is None or failure.rank is None else failure.rank
    return -1 if report.cause_rank is None else report.cause_rank


@dataclass(frozen=True)
class JobView:
    """A job: live from its watcher on the bus, or final from its journal record.

    `status` is -1, `cause` "" and `cause_rank` -1 until the job ended.
    `error` says why the job could not start; `cause_error` is the cause rank's
    traceback or last stderr lines (from `cause_error_source`); when the job
    ended because of another node (`node-failed`), that node's failed rank's. `ended_at` (µs
    since the epoch) comes from the record only.
    """

    job: str
    slice: str
    manager: str
    owner: int
    watcher_pid: int
    state: JobState
    world_size: int
    ranks: tuple[RankView, ...]
    status: int = -1
    cause: str = ""
    cause_rank: int = -1
    error: str = ""
    restarts: int = 0
    cause_error: str = ""
    cause_error_source: str = ""
    ended_at: int = 0
    # Multi-node jobs (-1 / () / "" for one node): this node, every node, and the
    # job's first failure as all nodes agree on it (cause_node -1: not a node's).
    node_rank: int = -1
    nodes: tuple[NodeInfo, ...] = ()
    cause_node: int = -1
    cause_host: str = ""
    cause_what: str = ""
    # µs since the epoch of each rank's last output line, in `ranks` order (0: none yet);
    # () where unknown (a record, or a watcher that does not publish it).
    last_output: tuple[int, ...] = ()
    interrupted_by: str = ""  # what interrupted it, when not a signal to its watcher
    log_drops: tuple[LogDrop, ...] = ()  # ranks of which the journal lacks lines (the end)
    gpu_use: GpuUse | None = None  # ranks on GPUs: their accounting (the end)
    rounds: tuple[RoundEnd, ...] = ()  # multi-node: the attempts before the last (the end)
    carried: Carried | None = None  # a Slurm job's: what a requeued run continues (the end)
    from_record: bool = False  # read from a record file (filerecord.py), not the bus
    goodput: Goodput | None = None  # ETTR and what failures cost (None: no steps reported)
    phases: tuple[AttemptPhases, ...] = ()  # where each attempt's start went (so far)

    @property
    def layout(self) -> Layout | None:
        if self.node_rank < 0:
            return None
        return Layout(
            node_rank=self.node_rank,
            nnodes=len(self.nodes),
            world_size=self.world_size,
            master_addr="",
            master_port=0,
            use_agent_store=True,
            run_id="",
            endpoint="",
            nodes=self.nodes,
        )

    @property
    def node_failure(self) -> NodeFailure | None:
        if not self.cause_what:
            return None
        remote = self.cause == Cause.NODE_FAILED.value  # then cause_error is that rank's
        return NodeFailure(
            node=self.cause_node,
            host=self.cause_host,
            status=self.status,
            what=self.cause_what,
            # cause_rank is the job's cause rank: on another node, a global rank not ours
            rank=self.cause_rank if remote and self.cause_rank >= 0 else None,
            error=(self.cause_error or None) if remote else None,
            error_source=(self.cause_error_source or None) if remote else None,
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "job": self.job,
            "slice": self.slice,
            "manager": self.manager,
            "owner": self.owner,
            "watcher_pid": self.watcher_pid,
            "state": self.state.value,
            "world_size": self.world_size,
            "status": None if self.status < 0 else self.status,
            "cause": self.cause or None,
            "cause_rank": None if self.cause_rank < 0 else self.cause_rank,
            "error": self.error or None,
            "restarts": self.restarts,
            "cause_error": self.cause_error or None,
            "cause_error_source": self.cause_error_source or None,
            "interrupted_by": self.interrupted_by or None,
            "ended_at_usec": self.ended_at or None,
            "ranks": [ranks_json(r) for r in self.ranks],
            "node_rank": None if self.node_rank < 0 else self.node_rank,
            "nodes": [dataclasses.asdict(n) for n in self.nodes],
            "node_cause": None if self.node_failure is None else self.node_failure.to_dict(),
            "log_drops": [d.to_dict() for d in self.log_drops],
            "gpu_use": None if self.gpu_use is None else self.gpu_use.to_dict(),
            "rounds": [r.to_dict() for r in self.rounds],
            "goodput": None if self.goodput is None else self.goodput.to_dict(),
            "phases": [p.to_dict() for p in self.phases],
            "slurm_runs": None if self.carried is None else self.carried.to_dict(),
        }

    def report(self) -> JobReport:
        """The final report (for `format_report`); only for an ended job."""
        cause = Cause(self.cause) if self.cause else Cause.START_FAILED
        return JobReport(
            job=self.job,
            status=self.status,
            cause=cause,
            # the report's cause rank is one of this node's ranks (see node_failure)
            cause_rank=(
                self.cause_rank if self.cause_rank >= 0 and cause is not Cause.NODE_FAILED else None
            ),
            interrupt_signal=self.status - 128 if cause is Cause.INTERRUPTED else None,
            interrupted_by=self.interrupted_by or None,
            ranks=tuple(
                dataclasses.replace(
                    r.result(),
                    error=self.cause_error or None,
                    error_source=self.cause_error_source or None,
                )
                if r.rank == self.cause_rank
                else r.result()
                for r in self.ranks
            ),
            error=self.error or None,
            restarts=self.restarts,
            layout=self.layout,
            node_failure=self.node_failure,
            log_drops=self.log_drops,
            gpu_use=self.gpu_use,
            rounds=self.rounds,
            goodput=self.goodput,
            carried=self.carried,
            phases=self.phases,
        )

    @classmethod
    def of_progress(
        cls,
        job: JobProgress,
        report: JobReport | None = None,
        goodput: Goodput | None = None,
        phases: tuple[AttemptPhases, ...] = (),
    ) -> JobView:
        """The live view of a running job (`goodput`, `phases`: so far); with `report`, the
        final one."""
        spec = job.spec
        if report is not None:
            state = JobState.of_report(report)
        elif job.phase is Phase.DONE:
            state = JobState.STOPPING  # the report is on its way
        else:
            state = JobState(job.phase.value)
        ranks = report.ranks if report is not None else ()
        cause = next((r for r in ranks if report and r.rank == report.cause_rank), None)
        failure = job.node_failure
        error, source = (cause.error, cause.error_source) if cause else (None, None)
        if report is not None and report.cause is Cause.NODE_FAILED and failure is not None:
            error, source = failure.error, failure.error_source
        return cls(
            job=spec.job,
            slice=job.contained_in or spec.names.job_slice,
            manager=NO_MANAGER if job.contained_in else spec.manager.value,
            owner=os.getuid(),
            watcher_pid=job.watcher_pid,
            state=state,
            world_size=spec.world_size,
            ranks=tuple(RankView.of_progress(r) for r in job.ranks),
            status=-1 if report is None else report.status,
            cause="" if report is None else report.cause.value,
            cause_rank=_cause_rank(report, failure),
            error="" if report is None or report.error is None else report.error,
            restarts=job.attempt,
            cause_error=error or "",
            cause_error_source=source or "",
            node_rank=-1 if spec.layout is None else spec.layout.node_rank,
            nodes=() if spec.layout is None else spec.layout.nodes,
            cause_node=-1 if failure is None else failure.node,
            cause_host="" if failure is None else failure.host,
            cause_what="" if failure is None else failure.what,
            interrupted_by="" if report is None else report.interrupted_by or "",
            log_drops=() if report is None else report.log_drops,
            gpu_use=None if report is None else report.gpu_use,
            rounds=() if report is None else report.rounds,
            goodput=goodput if report is None else report.goodput,
            phases=phases if report is None else report.phases,
            carried=job.carried if report is None else report.carried,
        )

    def placement(self) -> tuple[str, str]:
        """Where its ranks are and who holds them, in words: its slice and its manager, or
        the direct supervisor's cgroup (or process groups) and no manager."""
        if self.manager != NO_MANAGER:
            return self.slice, f"{self.manager} manager"
        where = self.slice if self.slice == PROCESS_GROUPS else f"cgroup {self.slice}"
        return where, "direct supervisor, no manager"

    def properties(self) -> dict[str, tuple[str, Any]]:
        """The D-Bus properties of interface io.gpulaunch.Job1: name -> (signature, value)."""
        return {
            "Id": ("s", self.job),
            "Slice": ("s", self.slice),
            "Manager": ("s", self.manager),
            "Owner": ("u", self.owner),
            "WatcherPID": ("u", self.watcher_pid),
            "State": ("s", self.state.value),
            "WorldSize": ("u", self.world_size),
            "Ranks": ("a" + RANK_SIGNATURE, [r.wire() for r in self.ranks]),
            "Status": ("i", self.status),
            "Cause": ("s", self.cause),
            "CauseRank": ("i", self.cause_rank),
            "NodeRank": ("i", self.node_rank),
            "Nodes": ("a" + NODE_SIGNATURE, [node_wire(n) for n in self.nodes]),
            "CauseNode": ("i", self.cause_node),
            "CauseHost": ("s", self.cause_host),
            "CauseWhat": ("s", self.cause_what),
            "LastOutput": ("at", list(self.last_output)),
            "RankEnds": ("a" + RANK_END_SIGNATURE, [e for r in self.ranks if (e := r.end_wire())]),
            "Steps": ("a" + STEPS_SIGNATURE, [w for r in self.ranks if (w := steps_wire(r))]),
            "Stragglers": ("ai", [r.rank for r in self.ranks if r.steps and r.steps.straggler]),
            "InterruptedBy": ("s", self.interrupted_by),
            "Goodput": (GOODPUT_SIGNATURE, goodput_wire(self.goodput)),
            "Phases": (PHASES_SIGNATURE, phases_wire(self.phases)),
        }

    @classmethod
    def from_properties(cls, props: Mapping[str, Any]) -> JobView:
        """From the values of `GetAll` (unwrapped from their variants)."""
        ranks = tuple(RankView.from_wire(r) for r in props["Ranks"])
        return cls(
            job=str(props["Id"]),
            slice=str(props["Slice"]),
            manager=str(props["Manager"]),
            owner=int(props["Owner"]),
            watcher_pid=int(props["WatcherPID"]),
            state=JobState(props["State"]),
            world_size=int(props["WorldSize"]),
            ranks=with_steps(with_ends(ranks, props.get("RankEnds", ())), props.get("Steps", ())),
            status=int(props["Status"]),
            cause=str(props["Cause"]),
            cause_rank=int(props["CauseRank"]),
            node_rank=int(props.get("NodeRank", -1)),
            nodes=tuple(node_from_wire(n) for n in props.get("Nodes", ())),
            cause_node=int(props.get("CauseNode", -1)),
            cause_host=str(props.get("CauseHost", "")),
            cause_what=str(props.get("CauseWhat", "")),
            last_output=tuple(int(t) for t in props.get("LastOutput", ())),
            interrupted_by=str(props.get("InterruptedBy", "")),
            goodput=goodput_from_wire(props.get("Goodput")),
            phases=phases_from_wire(props.get("Phases")),
        )
