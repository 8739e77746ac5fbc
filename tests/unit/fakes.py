"""What unit tests share: fakes for pure logic (a systemd that answers at once), a job and
its watcher made in one call, rendered units, views. Test modules import from here, never
from one another.
"""

from __future__ import annotations

import asyncio
import os
import signal
import struct
from collections.abc import Callable, Sequence
from pathlib import Path

from gpulaunch.base.names import UnitNames
from gpulaunch.base.protocol import Layout, NodeInfo
from gpulaunch.errors import (
    JobExistsError,
    SystemdError,
)
from gpulaunch.jobapi import record
from gpulaunch.jobapi.rankview import RankView
from gpulaunch.jobapi.view import (
    JobState,
    JobView,
)
from gpulaunch.logs.output import Output, OutputOptions
from gpulaunch.logs.terminal import Terminal
from gpulaunch.model import (
    JobProgress,
    JobSpec,
    Manager,
    Phase,
    RankExit,
    RankProgress,
    RankSpec,
    RankState,
    StepInfo,
)
from gpulaunch.parts import Controls
from gpulaunch.plan.gpus import Gpu
from gpulaunch.plan.spec import StartOptions
from gpulaunch.plan.topology import CpuTopology
from gpulaunch.progress.timeline import Timeline
from gpulaunch.supervisor.systemd_api import (
    JobDone,
    JobEvent,
    JobQueued,
    UnitState,
)
from gpulaunch.units.codec import Property
from gpulaunch.units.definitions import JobUnits, UnitDefinition


class FakeSystemd:
    """Units are names with pids; every job is done as soon as it is queued."""

    def __init__(self, fail_start: str | None = None, start_result: str = "done") -> None:
        self._r, self._w = os.pipe()
        os.set_blocking(self._r, False)
        self.queue: list[JobEvent] = []
        self.units: dict[str, list[int]] = {}
        self.calls: list[tuple[str, str]] = []
        self.killed: list[str] = []
        self.fail_start = fail_start
        self.start_result = start_result
        self._n = 0

    def _job(self, unit: str, result: str = "done") -> str:
        """A job queued and done, announced as systemd does: JobNew, then JobRemoved."""
        self._n += 1
        path = f"/org/freedesktop/systemd1/job/{self._n}"
        self.queue += [JobQueued(path, unit), JobDone(path, unit, result)]
        os.write(self._w, b"x")
        return path

    def fileno(self) -> int:
        return self._r

    def start_transient(
        self,
        name: str,
        properties: Sequence[Property],
        pids: Sequence[int] = (),
        aux: Sequence[tuple[str, Sequence[Property]]] = (),
    ) -> str:
        self.calls.append(("start", name))
        self.calls.extend(("aux", unit) for unit, _ in aux)
        if name == self.fail_start:
            raise SystemdError(f"systemd could not create {name}: test")
        if any(unit in self.units for unit in (name, *(u for u, _ in aux))):
            raise JobExistsError(f"unit {name} already exists")
        self.units.update((unit, []) for unit, _ in aux)
        for unit, _ in aux:  # their start jobs: paths the caller never sees
            self._job(unit)
        self.units[name] = list(pids)
        return self._job(
            name, self.start_result if name.endswith(".scope") and "-rank" in name else "done"
        )

    def stop_unit(self, name: str) -> str | None:
        self.calls.append(("stop", name))
        if name not in self.units:
            return None
        for unit, pids in list(self.units.items()):
            if unit == name if name.endswith(".scope") else "-rank" in unit:
                for pid in pids:
                    try:
                        os.kill(pid, signal.SIGTERM)
                    except ProcessLookupError:
                        pass
                del self.units[unit]  # a stopped transient unit is gone
        self.units.pop(name, None)
        return self._job(name)

    def kill_unit(self, name: str, signum: int) -> None:
        self.calls.append(("kill", name))
        self.killed.append(name)
        for pid in self.units.get(name, []):
            try:
                os.kill(pid, signum)
            except ProcessLookupError:
                pass

    def reconnect(self) -> None:
        raise AssertionError("the fake never loses its connection")

    def unit_state(self, name: str) -> UnitState:
        return UnitState("active" if name in self.units else "inactive", False)

    def ping(self) -> None:
        pass

    def events(self) -> list[JobEvent]:
        try:
            os.read(self._r, 4096)
        except BlockingIOError:
            pass
        done, self.queue = self.queue, []
        return done


def make_job(
    commands: Sequence[Sequence[str]], job: str = "t", max_restarts: int = 0
) -> tuple[JobSpec, JobUnits]:
    names = UnitNames.for_job(job)
    ranks = tuple(
        RankSpec(
            rank=i, local_rank=i, unit=names.rank_scope(i), argv=tuple(argv), env=dict(os.environ)
        )
        for i, argv in enumerate(commands)
    )
    spec = JobSpec(
        job=job,
        names=names,
        manager=Manager.SYSTEM,
        argv=tuple(commands[0]),
        cwd=os.getcwd(),
        nproc=len(ranks),
        world_size=len(ranks),
        master_addr="127.0.0.1",
        master_port=1,
        grace_sec=1.0,
        ranks=ranks,
        max_restarts=max_restarts,
    )

    def unit(name: str) -> UnitDefinition:
        return UnitDefinition(name=name, template=Path("x"), text="", properties=())

    units = JobUnits(
        job=job,
        job_slice=unit(names.job_slice),
        ranks_slice=unit(names.ranks_slice),
        watcher=unit(names.watcher_scope),
        ranks=tuple(unit(r.unit) for r in ranks),
        anchor=lambda pid: unit(names.anchor_service),
        launch=lambda setup: unit(names.launch_service),
        tie=lambda pid: unit(names.tie_service),
    )
    return spec, units


def sh(script: str) -> list[str]:
    return ["/bin/sh", "-c", script]


def children() -> set[int]:
    """This process's children, reaped or not (a session's box may be one of them)."""
    pids: set[int] = set()
    for task in Path("/proc/self/task").iterdir():
        pids.update(int(p) for p in (task / "children").read_text().split())
    return pids


_BEFORE: set[int] = set()


def no_children_left() -> bool:
    """Every child the watcher forked in this test is gone and reaped."""
    return children() <= _BEFORE


class Screen:
    """A file standing in for a terminal; `read()` returns what was written since the last read."""

    def __init__(self, tty: bool = False) -> None:
        self.fd = os.memfd_create("screen")
        self.term = Terminal(self.fd)
        self.term.is_tty = tty
        self._seen = 0

    def read(self) -> bytes:
        data = os.pread(self.fd, 1 << 30, self._seen)
        self._seen += len(data)
        return data


def make(
    options: OutputOptions | None = None, world: int = 4, tty: bool = False
) -> tuple[Output, Screen, Screen]:
    out, err = Screen(tty), Screen(tty)
    return Output(options or OutputOptions(), world, out.term, err.term), out, err


def job_view(**kw: object) -> JobView:
    ranks = (
        RankView(0, 0, "gpulaunch-j-rank0.scope", 10, "stopped", -1, 15, True, 143, 1.5),
        RankView(1, 1, "gpulaunch-j-rank1.scope", 11, "exited", 7, 0, False, 7, 1.25),
    )
    base: dict[str, object] = dict(
        job="j",
        slice="gpulaunch-j.slice",
        manager="system",
        owner=0,
        watcher_pid=9,
        state=JobState.FAILED,
        world_size=2,
        ranks=ranks,
        status=7,
        cause="rank-failed",
        cause_rank=1,
    )
    base.update(kw)
    return JobView(**base)  # type: ignore[arg-type]


def decode(data: bytes) -> dict[str, str]:
    """The journal's native protocol, read back."""
    out: dict[str, str] = {}
    while data:
        line, _, rest = data.partition(b"\n")
        if b"=" in line:
            key, _, value = line.partition(b"=")
            out[key.decode()] = value.decode()
            data = rest
        else:
            (size,) = struct.unpack("<Q", rest[:8])
            out[line.decode()] = rest[8 : 8 + size].decode()
            assert rest[8 + size : 9 + size] == b"\n"
            data = rest[9 + size :]
    return out


class Untouchable:
    """An inventory or topology that must not be read."""

    def gpus(self) -> tuple[Gpu, ...]:
        raise AssertionError("the GPU inventory was read")

    def __call__(self) -> CpuTopology:
        raise AssertionError("the CPU topology was read")


def placement_options(script: Path, **kw: object) -> StartOptions:
    base: dict[str, object] = dict(
        script=script.name,
        args=(),
        nproc=2,
        job="demo",
        master_addr="127.0.0.1",
        master_port=29500,
        grace_sec=10.0,
        manager=Manager.SYSTEM,
    )
    return StartOptions(**{**base, **kw})  # type: ignore[arg-type]


NODES = (
    NodeInfo(node=0, host="hostA", first_rank=0, nproc=2, pid=100),
    NodeInfo(node=1, host="hostB", first_rank=2, nproc=2, pid=200),
    NodeInfo(node=2, host="hostC", first_rank=4, nproc=1, pid=300),
)


LAYOUT = Layout(
    node_rank=0,
    nnodes=3,
    world_size=5,
    master_addr="hostA",
    master_port=29500,
    use_agent_store=True,
    run_id="j",
    endpoint="hostA:29500",
    nodes=NODES,
)


def multinode_view(**kw: object) -> JobView:
    """Node 0 of three, stopped because rank 3 on node 1 failed (test_jobapi's view, grown)."""
    ranks = (
        RankView(0, 0, "gpulaunch-j-rank0.scope", 10, "stopped", -1, 15, True, 143, 2.0),
        RankView(1, 1, "gpulaunch-j-rank1.scope", 11, "stopped", -1, 15, True, 143, 2.0),
    )
    multinode: dict[str, object] = dict(
        world_size=5,
        ranks=ranks,
        status=1,
        cause="node-failed",
        cause_rank=-1,
        node_rank=0,
        nodes=NODES,
        cause_node=1,
        cause_host="hostB",
        cause_what="rank 3 exit 1",
    )
    return job_view(**{**multinode, **kw})


def entry(v: JobView) -> dict[str, str]:
    """The record as journalctl gives it back, with the fields journald adds."""
    e = decode(record.encode(record.fields(v, "the message")))
    e.update({"_UID": str(v.owner), "__REALTIME_TIMESTAMP": "1700000000000000"})
    return e


REPO_UNITS = Path(__file__).parents[2] / "units"


# An ordinary invoking user whose files these are (as root: files are root's, trusted anyway).
ORDINARY = os.geteuid() or 65534


JOB = "demo"


COMMON: dict[str, object] = {
    "job": JOB,
    "job_slice": "gpulaunch-demo.slice",
    "ranks_slice": "gpulaunch-demo-ranks.slice",
    "watcher_scope": "gpulaunch-demo-watcher.scope",
    "world_size": 4,
    "nproc": 4,
    "grace_sec": 30,
    "argv": ["/usr/bin/python3", "train.py", "--epochs", "3"],
    "memory_max": "48G",
    "job_memory_max": "200G",
    "description": "train.py --epochs 3",
}


def rank_context(rank: int) -> dict[str, object]:
    return {
        **COMMON,
        "rank": rank,
        "local_rank": rank,
        "gpu": rank,
        "cpus": f"{rank * 8}-{rank * 8 + 7}",
        "device_allow": [
            ("/dev/char/195:255", "rw"),  # nvidiactl
            ("char-nvidia-uvm", "rw"),
            (f"/dev/char/195:{rank}", "rw"),  # this rank's GPU
        ],
    }


def by_name(properties: tuple[Property, ...]) -> dict[str, object]:
    names = [p.name for p in properties]
    assert len(names) == len(set(names)), names
    return {p.name: p.value for p in properties}


def write(directory: Path, name: str, text: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / name).write_text(text)
    return directory / name


def marker_template(marker: str) -> str:
    return f"[Unit]\nDescription={marker}\n[Slice]\n"


def record_view(state: JobState, pid: int | None = None, job: str = "j") -> JobView:
    """A one-rank job as a record file keeps it (jobapi/filerecord.py)."""
    rank = RankView(
        rank=0, local_rank=0, unit="u", pid=5, state="running", exit_code=-1, signal=0,
        stopped_by_watcher=False, status=-1, runtime=0.0,
    )  # fmt: skip
    return JobView(
        job=job, slice="s", manager="user", owner=os.getuid(),
        watcher_pid=os.getpid() if pid is None else pid, state=state, world_size=1,
        ranks=(rank,), status=0 if state.ended else -1,
        cause="succeeded" if state.ended else "",
    )  # fmt: skip


class Clock:
    """A clock the test sets (`clock.t = 2.0`)."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def progress_rank(n: int, steps: StepInfo | None, ended: RankExit | None = None) -> RankProgress:
    """Rank n as a JobProgress snapshot holds it: running, or ended as `ended` says."""
    state = RankState.RUNNING
    if ended is not None:
        state = RankState.STOPPED if ended.stopped_by_watcher else RankState.EXITED
    return RankProgress(n, n, f"r{n}", state, 100 + n, False, ended, steps)


def rank_exit(code: int, at: float, stopped: bool = False) -> RankExit:
    return RankExit(code=code, signal=None, stopped_by_watcher=stopped, observed_at=at, runtime=1)


def attached_timeline(spec: JobSpec, clock: Clock) -> tuple[Timeline, Callable[..., None]]:
    """A goodput Timeline attached as the watcher attaches a Part, and `snap(attempt, phase,
    *ranks)`: the watcher's JobProgress snapshot handed to its `changed`."""
    part = Timeline(clock)

    def snap(attempt: int, phase: Phase, *ranks: RankProgress) -> None:
        part.changed(JobProgress(spec, phase, ranks, attempt, 1), None)

    loop = asyncio.new_event_loop()
    part.attach(JobProgress(spec, Phase.STARTING, (), 0, 1), Controls(lambda: None), loop)
    loop.close()
    return part, snap
