"""The plan of a job, the state of its ranks, and the exit-status rules.

Everything here is data and pure functions: no processes, no systemd.
"""

from __future__ import annotations

import enum
import signal
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gpulaunch.base.names import UnitNames
from gpulaunch.base.protocol import Layout, NodeConfig, NodeFailure, RoundEnd
from gpulaunch.base.slurmruns import REQUEUE_STATUS as REQUEUE_STATUS  # its home: there
from gpulaunch.base.slurmruns import Carried as Carried


class Manager(enum.StrEnum):
    """Which systemd manager owns the job's units."""

    SYSTEM = "system"
    USER = "user"


class SupervisorKind(enum.StrEnum):
    """Who contains and stops a job's ranks (`--supervisor`; gpulaunch/supervisor/choose.py)."""

    SYSTEMD = "systemd"  # scopes and slices of a systemd manager
    DIRECT = "direct"  # the watcher: its own cgroups, else process groups
    AUTO = "auto"  # direct in a Slurm step or without a manager, else systemd


@dataclass(frozen=True)
class RankSpec:
    """One rank as planned: what runs, with which environment, in which unit."""

    rank: int
    local_rank: int
    unit: str
    argv: tuple[str, ...]
    env: Mapping[str, str]
    # Placement (gpulaunch/plan/placement.py): the GPU's index, AllowedCPUs=, DeviceAllow= rules.
    gpu: int | None = None
    cpus: str | None = None
    device_allow: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class StragglerRule:
    """--straggler-factor, --straggler-steps: a rank whose step time stays above `factor`
    times the median of the others' for `steps` steps is a straggler, until it keeps up
    for as many steps (gpulaunch/progress/stragglers.py)."""

    factor: float = 1.5
    steps: int = 10


@dataclass(frozen=True)
class JobSpec:
    """Everything `gpulaunch start` decided before starting anything."""

    job: str
    names: UnitNames
    manager: Manager
    argv: tuple[str, ...]
    cwd: str
    nproc: int
    world_size: int
    master_addr: str
    master_port: int
    grace_sec: float
    ranks: tuple[RankSpec, ...]
    memory_max: str | None = None  # per rank (MemoryMax= of each rank scope)
    job_memory_max: str | None = None  # all ranks and the watcher (MemoryMax= of the job slice)
    max_restarts: int = 0
    command: tuple[str, ...] = ()  # what the user asked to run, as given (for descriptions)
    node_config: NodeConfig | None = None  # multi-node: how this node joins the others
    layout: Layout | None = None  # multi-node: where the rendezvous put this node
    signal_whole_rank: bool = False  # SIGUSR1/2 to every process of a rank, not only its main
    stdin_rank: int | None = 0  # the rank that reads the watcher's stdin (watcher/terminal.py)
    stragglers: StragglerRule = StragglerRule()  # --straggler-factor, --straggler-steps
    gpu_job_map: Path | None = None  # --gpu-job-map: DCGM's GPU -> job files (schedulers/)
    termination_log: Path | None = None  # Kubernetes' termination message (schedulers/)


class RankState(enum.StrEnum):
    """Where a rank is in its life; only `Rank.advance` changes it.

    ::

        pending --fork--> held --scope started, gate opened--> running
           |                |                                   |
           |                +----------- exit ------------------+--> exited
           |                                                    |
           +--(never forked)        watcher stopped it ---------+--> stopped

    `exited` means the rank ended on its own; `stopped` means the watcher had
    already asked systemd to stop it when it ended.
    """

    PENDING = "pending"
    HELD = "held"
    RUNNING = "running"
    EXITED = "exited"
    STOPPED = "stopped"

    @property
    def alive(self) -> bool:
        return self in (RankState.HELD, RankState.RUNNING)


_TRANSITIONS: dict[RankState, frozenset[RankState]] = {
    RankState.PENDING: frozenset({RankState.HELD}),
    RankState.HELD: frozenset({RankState.RUNNING, RankState.EXITED, RankState.STOPPED}),
    RankState.RUNNING: frozenset({RankState.EXITED, RankState.STOPPED}),
    RankState.EXITED: frozenset(),
    RankState.STOPPED: frozenset(),
}


def check_transition(old: RankState, new: RankState) -> None:
    """Raise if a rank may not go from `old` to `new` (an internal bug, not user input)."""
    if new not in _TRANSITIONS[old]:
        raise RuntimeError(f"illegal rank state transition {old} -> {new}")


def signal_name(signum: int) -> str:
    """`SIGKILL` for 9; `signal 42` where Python knows no name."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def format_bytes(n: int) -> str:
    """`11.8 GiB`, `300.0 MiB`, `512 B` (base 1024, as --memory-max reads them)."""
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{n} B" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


@dataclass(frozen=True)
class OomKill:
    """The kernel's OOM killer ended the rank (its own limit, the job's, or the machine's).

    `memory` is what the rank's unit used when it was killed and `limit` its
    `memory.max`, where known; `source` says which the finding came from
    (the cgroup's `memory.events`, or the kernel log).
    """

    memory: int | None
    limit: int | None
    source: str

    def describe(self) -> str:
        """`killed by the OOM killer at 11.8 GiB (limit 12.0 GiB)`."""
        text = "killed by the OOM killer"
        if self.memory is not None:
            text += f" at {format_bytes(self.memory)}"
        if self.limit is not None:
            text += f" (limit {format_bytes(self.limit)})"
        return text


@dataclass(frozen=True)
class RankUsage:
    """What a rank used over its life, read when it ended (gpulaunch/watcher/final.py).

    Each number is None where it could not be had; `*_source` says where it
    came from (the report prints them once).
    """

    cpu_sec: float | None = None
    cpu_source: str = ""
    peak_memory: int | None = None  # bytes
    peak_source: str = ""
    gpu_memory: int | None = None  # bytes, peak over the rank's processes (NVML accounting)


@dataclass(frozen=True)
class RankExit:
    """How one rank ended.

    Exactly one of `code` and `signal` is set. `observed_at` is the watcher's
    `time.monotonic()` when it reaped the rank; it orders failures. `usage`
    is what it used (where it could be read); `oom` is set when the kernel's
    OOM killer killed it.
    """

    code: int | None
    signal: int | None
    stopped_by_watcher: bool
    observed_at: float
    runtime: float
    core_dumped: bool = False
    usage: RankUsage | None = None
    oom: OomKill | None = None

    @property
    def status(self) -> int:
        """The shell's view of this exit: the code, or 128+N for signal N."""
        if self.signal is not None:
            return 128 + self.signal
        assert self.code is not None
        return self.code

    @property
    def failed(self) -> bool:
        return self.status != 0

    def describe(self) -> str:
        """`exit 7`, `SIGKILL`, `SIGSEGV (core dumped)`, `killed by the OOM killer at ...`."""
        if self.oom is not None and self.signal == signal.SIGKILL:
            return self.oom.describe()
        if self.signal is not None:
            return signal_name(self.signal) + (" (core dumped)" if self.core_dumped else "")
        return f"exit {self.code}"


class Phase(enum.StrEnum):
    """The job's life as its watcher runs it: starting -> running -> stopping -> done."""

    STARTING = "starting"
    RUNNING = "running"
    STOPPING = "stopping"
    DONE = "done"


@dataclass(frozen=True)
class StepInfo:
    """What a rank said of its training through the progress channel (gpulaunch/progress/).

    `at` is the CLOCK_MONOTONIC time of its last step report: readers compute the
    seconds since then themselves. Rates and step times are over the recent steps.
    """

    step: int
    total: int | None  # the steps it expects in all, if it said so
    at: float
    steps_per_second: float | None  # None until two steps were seen
    step_seconds: float | None  # the recent mean time of one step
    straggler: bool = False  # its step time stays above the others' (--straggler-*)
    straggled: int = 0  # how many times it was flagged a straggler (this attempt)
    first_at: float | None = None  # CLOCK_MONOTONIC of its first step report (this attempt)
    checkpoint: int | None = None  # the step of its last checkpoint notice (this attempt)
    checkpoint_at: float | None = None  # CLOCK_MONOTONIC of that notice

    def eta_seconds(self) -> float | None:
        """Seconds until `total` at the current rate, where both are known."""
        if self.total is None or not self.steps_per_second:
            return None
        return max(0, self.total - self.step) / self.steps_per_second


@dataclass(frozen=True)
class RankProgress:
    """One rank as its watcher sees it at one instant (immutable: observers keep it)."""

    rank: int
    local_rank: int
    unit: str
    state: RankState
    pid: int | None  # None until it was forked
    stop_requested: bool  # the watcher asked for it to be stopped
    exit: RankExit | None
    steps: StepInfo | None = None  # None while (or if ever) the rank reports no steps
    status_text: str | None = None  # its last STATUS= through the progress channel


@dataclass(frozen=True)
class JobProgress:
    """The job as its watcher sees it at one instant: what observers are handed.

    The bus publisher, the record and the terminal read the job through this,
    never through the watcher itself (docs/architecture.md, "Observers").
    """

    spec: JobSpec
    phase: Phase
    ranks: tuple[RankProgress, ...]
    attempt: int  # restarts of the whole gang so far
    watcher_pid: int
    node_failure: NodeFailure | None = None  # multi-node: the job's first failure, any node
    # no systemd unit holds it (the direct supervisor): where its ranks are instead, its
    # cgroup's path or "process groups"
    contained_in: str | None = None
    # a Slurm job's: what a requeued run continues from, should this one's watcher be
    # killed before the end (its attempts; its record keeps it from the start)
    carried: Carried | None = None


@dataclass(frozen=True)
class RankResult:
    """A rank's line in the report."""

    rank: int
    unit: str
    pid: int | None
    exit: RankExit | None
    error: str | None = None  # the cause rank's traceback (error file) or stderr tail
    error_source: str | None = None  # where `error` came from


class Cause(enum.StrEnum):
    """Why a job ended."""

    SUCCEEDED = "succeeded"
    RANK_FAILED = "rank-failed"
    INTERRUPTED = "interrupted"
    START_FAILED = "start-failed"
    NODE_FAILED = "node-failed"  # multi-node: the first failure was on another node
    HUNG = "hung"  # --hang-timeout: no output and no CPU for that long (status HUNG_STATUS)
    PREEMPTED = "preempted"  # --preempt-grace: the machine goes away (PREEMPTED_STATUS)
    CRASH_LOOP = "crash-loop"  # --crash-loop: attempts failed alike, none progressed
    TIME_LIMIT = "time-limit"  # Slurm's --time ran out (gpulaunch/schedulers/slurm.py)
    REQUEUE = "requeue"  # --max-restarts spent, --max-requeues left: Slurm runs it again


HUNG_STATUS = 124  # like timeout(1)
PREEMPTED_STATUS = 79  # gpulaunch/recovery/preempt.py: for a scheduler to requeue the job
CRASH_LOOP_STATUS = 80  # gpulaunch/recovery/policy.py
TIME_LIMIT_STATUS = 85  # gpulaunch/schedulers/slurm.py: the job's time was up, not a failure


@dataclass(frozen=True)
class LogDrop:
    """journald kept fewer of a rank's lines than the rank wrote.

    Its rate limit (`rate_limited`: the rank wrote more than the burst), or
    (`unreachable`) it was away for a while (stopped, restarted), or neither: it
    received them and did not store or keep them (its storage full or over
    `SystemMaxUse=`/`RuntimeMaxUse=`). Counted for every rank, whatever the cause.
    """

    rank: int
    written: int
    stored: int
    unreachable: bool = False
    rate_limited: bool = True
    crowded: bool = False  # the pump left lines out: journald took them slower than the rank

    def to_dict(self) -> dict[str, int | bool]:
        return asdict(self)


@dataclass(frozen=True)
class RankGpuUse:
    """One rank's use of its GPU (gpulaunch/leases/accounting.py); None: NVML did not say."""

    rank: int
    gpu: int  # the GPU's index (nvidia-smi's numbering)
    peak_memory: int | None = None  # bytes, NVML accounting (nvidia-smi -am 1)
    mean_utilisation: int | None = None  # percent of the rank's life, NVML accounting
    xids: tuple[int, ...] = ()  # XIDs NVML reported on its GPU while the job ran


@dataclass(frozen=True)
class GpuUse:
    """A job's GPU accounting: its ranks' use, and GPU-seconds and energy for the job."""

    ranks: tuple[RankGpuUse, ...]
    gpu_seconds: float  # GPUs held x the job's wall time
    energy_joules: float | None = None  # NVML's total energy counters, end minus start

    def to_dict(self) -> dict[str, Any]:
        return {
            "gpu_seconds": round(self.gpu_seconds, 3),
            "energy_joules": self.energy_joules,
            "ranks": [{**asdict(r), "xids": list(r.xids)} for r in self.ranks],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> GpuUse:
        return cls(
            ranks=tuple(
                RankGpuUse(**{**r, "xids": tuple(r.get("xids", ()))}) for r in data["ranks"]
            ),
            gpu_seconds=float(data["gpu_seconds"]),
            energy_joules=data.get("energy_joules"),
        )


@dataclass(frozen=True)
class Loss:
    """What one failure cost, in seconds (docs/progress.md, "Goodput", defines each part).

    `attempt`: the attempt that failed (0: the first). `redone`: its steps after its last
    checkpoint (done again after the restart); `detection`: from its last step to the
    failure seen; `stop`: from then to its gang gone; `restart`: from then to the next
    attempt's first step (None: no attempt stepped after it)."""

    attempt: int
    redone: float
    detection: float
    stop: float
    restart: float | None

    @property
    def total(self) -> float:
        return self.redone + self.detection + self.stop + (self.restart or 0.0)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "total": self.total}


@dataclass(frozen=True)
class Goodput:
    """A job's goodput on this node (gpulaunch/progress/goodput.py): its effective training
    time ratio (ETTR) and what each failure cost, in seconds of CLOCK_MONOTONIC.

    `wall`: from the start line to the end (or now); `productive`: the time in which the
    ranks made steps that were kept; `startup`: from the start line to the first step.
    `checkpoints`: whether any rank said a checkpoint was written (without, a restart
    starts over: every step of a failed attempt is redone)."""

    wall: float
    productive: float
    startup: float
    losses: tuple[Loss, ...] = ()
    checkpoints: bool = False

    @property
    def lost(self) -> float:
        return sum(loss.total for loss in self.losses)

    @property
    def ratio(self) -> float:
        """ETTR: productive over wall time (0 to 1)."""
        return self.productive / self.wall if self.wall > 0 else 0.0

    def describe(self) -> str:
        """`goodput 91.2 % (ETTR): 54.70s of 1m00s in steps kept; 2 failures lost 4.10s`."""
        text = (
            f"goodput {100 * self.ratio:.1f} % (ETTR): {format_duration(self.productive)} of "
            f"{format_duration(self.wall)} in steps kept"
        )
        if self.losses:
            n = len(self.losses)
            text += f"; {n} failure{'s' if n > 1 else ''} lost {format_duration(self.lost)}"
        return text

    def to_dict(self) -> dict[str, Any]:
        return {
            "ettr": round(self.ratio, 6),
            "wall_seconds": round(self.wall, 6),
            "productive_seconds": round(self.productive, 6),
            "startup_seconds": round(self.startup, 6),
            "lost_seconds": round(self.lost, 6),
            "checkpoints": self.checkpoints,
            "failures": [loss.to_dict() for loss in self.losses],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Goodput:
        return cls(
            wall=float(data["wall_seconds"]),
            productive=float(data["productive_seconds"]),
            startup=float(data["startup_seconds"]),
            losses=tuple(
                Loss(
                    attempt=int(f["attempt"]),
                    redone=float(f["redone"]),
                    detection=float(f["detection"]),
                    stop=float(f["stop"]),
                    restart=None if f.get("restart") is None else float(f["restart"]),
                )
                for f in data.get("failures", ())
            ),
            checkpoints=bool(data.get("checkpoints", False)),
        )


# An attempt's phases, in the order they happen (docs/recovery.md, "Where the time goes"):
# the failure that restarted the gang seen, its ranks stopped, (several nodes) the round
# opened and closed, the new ranks forked, every rank's first output line, every rank's
# first step report. One not seen (no output, no steps, not this kind of job) is absent.
PHASES = (
    "failure_seen",
    "ranks_stopped",
    "round_opened",
    "round_closed",
    "ranks_forked",
    "first_line",
    "first_step",
)


@dataclass(frozen=True)
class AttemptPhases:
    """Where one attempt's start went (gpulaunch/progress/phases.py): each phase's time in
    seconds since `since`: "failure" (the failure seen that restarted the gang; the
    attempts after the first) or "start" (the start line; the first attempt)."""

    attempt: int  # 0: the first
    since: str  # "failure" or "start"
    phases: tuple[tuple[str, float], ...]  # (a name of PHASES, seconds), in PHASES' order

    def to_dict(self) -> dict[str, Any]:
        return {
            "attempt": self.attempt,
            "since": self.since,
            "phases": {name: round(seconds, 6) for name, seconds in self.phases},
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> AttemptPhases:
        phases = data.get("phases", {})
        return cls(
            attempt=int(data["attempt"]),
            since=str(data["since"]),
            phases=tuple((name, float(phases[name])) for name in PHASES if name in phases),
        )


@dataclass(frozen=True)
class LogFileGap:
    """A `--log-dir` file that stopped being written (a full disk, an I/O error)."""

    rank: int
    path: str
    error: str  # strerror, e.g. "No space left on device"
    lines_before: int  # the rank's lines written before it stopped (the last may be cut)
    lines_total: int = 0  # the rank's lines in all


@dataclass(frozen=True)
class JobReport:
    """The outcome of a job: what the watcher prints, publishes and records."""

    job: str
    status: int
    cause: Cause
    cause_rank: int | None
    interrupt_signal: int | None
    ranks: tuple[RankResult, ...] = field(default_factory=tuple)
    # interrupted, not by a signal to the watcher: "gpulaunch stop", "a stop of X from outside"
    interrupted_by: str | None = None
    error: str | None = None
    log_drops: tuple[LogDrop, ...] = ()
    log_file_gaps: tuple[LogFileGap, ...] = ()
    restarts: int = 0  # how many times the gang was restarted (--max-restarts)
    layout: Layout | None = None  # multi-node: this node and the others
    node_failure: NodeFailure | None = None  # multi-node: the job's first failure, any node
    rounds: tuple[RoundEnd, ...] = ()  # multi-node: the attempts before the last, their causes
    hang: str | None = None  # hung, --dump-stacks: which ranks were in which collective
    stacks: str | None = None  # --hang-timeout, --dump-stacks: the ranks' stacks, bounded
    gpu_use: GpuUse | None = None  # ranks on GPUs: their accounting (leases/accounting.py)
    recovery: str | None = None  # why the gang was not restarted (gpulaunch/recovery/)
    goodput: Goodput | None = None  # ETTR and what failures cost (None: no steps reported)
    carried: Carried | None = None  # a Slurm job's: what its next run (a requeue) continues
    phases: tuple[AttemptPhases, ...] = ()  # where each attempt's start went (progress/phases.py)


@dataclass(frozen=True)
class Outcome:
    """The result of `job_outcome`: status, why, and which rank caused it."""

    status: int
    cause: Cause
    cause_rank: int | None


def first_failure(exits: Mapping[int, RankExit]) -> int | None:
    """The rank whose failure the watcher observed first and did not cause itself."""
    failures = [
        (e.observed_at, rank) for rank, e in exits.items() if e.failed and not e.stopped_by_watcher
    ]
    return min(failures)[1] if failures else None


def job_outcome(
    exits: Mapping[int, RankExit],
    interrupt: tuple[float, int] | None = None,
    elsewhere: tuple[float, int] | None = None,
    hung_at: float | None = None,
) -> Outcome:
    """Apply the exit-status rules (README, "Exit status").

    `interrupt` is (monotonic time, signal number) of the first SIGINT/SIGTERM/
    SIGHUP the watcher received, if any. The earliest of the first rank failure
    and the interrupt is the cause; ranks the watcher stopped never are.
    `elsewhere` is (monotonic time, status) of a multi-node job's first failure
    when the store says it happened on another node: every node agrees on that
    one, so it beats this node's rank failures; only an interrupt that came
    before both this node's first rank failure and that news stays the cause.
    `hung_at`: when --hang-timeout found the job hung; the cause unless a rank
    failure or an interrupt came first.
    """
    rank = first_failure(exits)
    if hung_at is not None and elsewhere is None:
        earlier = [t for t in (interrupt[0] if interrupt else None,) if t is not None]
        earlier += [exits[rank].observed_at] if rank is not None else []
        if all(hung_at < t for t in earlier):
            return Outcome(HUNG_STATUS, Cause.HUNG, None)
    interrupted = interrupt is not None and (rank is None or interrupt[0] < exits[rank].observed_at)
    if elsewhere is not None and not (interrupted and interrupt and interrupt[0] < elsewhere[0]):
        return Outcome(elsewhere[1], Cause.NODE_FAILED, None)
    if interrupted and interrupt is not None:
        return Outcome(128 + interrupt[1], Cause.INTERRUPTED, None)
    if rank is not None:
        return Outcome(exits[rank].status, Cause.RANK_FAILED, rank)
    return Outcome(0, Cause.SUCCEEDED, None)


def format_duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.2f}s"
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m{secs:02d}s" if hours else f"{minutes}m{secs:02d}s"
