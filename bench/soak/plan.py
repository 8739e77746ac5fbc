"""The faults of the soak and one job's plan, drawn from the seed and the job's index alone.

Job `i` of seed `S` gets the same plan whatever else runs (`--first i --jobs 1` replays
it), given the same `--only`: the fault is drawn among the kinds that run.
"""

from __future__ import annotations

import enum
import random
import signal
from dataclasses import asdict, dataclass
from typing import Any


class Fault(enum.StrEnum):
    """One job's fault (what the README's exit-status rules make of it: bench/soak/judge.py)."""

    SUCCESS = "success"  # every rank exits 0
    RANK_EXIT = "rank-exit"  # a rank exits with a random code 1-255
    RANK_SIGKILL = "rank-sigkill"  # a rank SIGKILLs itself
    RANK_SIGSEGV = "rank-sigsegv"  # a rank SIGSEGVs itself
    WATCHER_SIGKILL = "watcher-sigkill"  # SIGKILL to `gpulaunch start`, start-up or running
    WATCHER_SIGTERM = "watcher-sigterm"  # SIGTERM to it, start-up or running; a rank fails too
    WATCHER_SIGINT = "watcher-sigint"  # SIGINT, the same
    LATE_SIGTERM = "late-sigterm"  # SIGTERM to it as it reports a rank's failure
    LATE_SIGINT = "late-sigint"  # SIGINT, the same
    SLICE_STOP = "slice-stop"  # `systemctl stop gpulaunch-<JOB>.slice` while it runs
    GPULAUNCH_STOP = "gpulaunch-stop"  # `gpulaunch stop JOB` while it runs
    DBUS_RESTART = "dbus-restart"  # `systemctl restart dbus` while it runs
    JOURNALD_RESTART = "journald-restart"  # `systemctl restart systemd-journald` while it runs
    # An ordinary user's job through the front end (bench/frontend.py's user, a login scope):
    FRONTEND_SIGKILL = "frontend-sigkill"  # SIGKILL to the front end while the job runs
    USER_MANAGER_STOP = "user-manager-stop"  # `systemctl stop user@UID.service` while it runs
    USER_MANAGER_REEXEC = "user-manager-reexec"  # the user manager's daemon-reexec
    LOGOUT = "logout"  # `loginctl terminate-user USER`: every session and the manager go
    # The direct supervisor, ranks with children of their own (a dataloader's workers):
    DIRECT_SIGKILL_CGROUP = "direct-sigkill-cgroup"  # SIGKILL to its watcher (cgroup way)
    DIRECT_SIGKILL_PGROUP = "direct-sigkill-pgroup"  # the same, process groups (user, no cgroup)
    STOP_AT_START = "stop-at-start"  # `systemctl stop` of the job slice as its units are made
    # The defects issue 35 fixed (items 5, 8, 11):
    RESTART_SIGTERM = "restart-sigterm"  # SIGTERM to the watcher while a restart's gang stops
    DIRECT_PKILL = "direct-pkill"  # the direct keeper and watcher SIGKILLed together (pkill -9)
    DIRECT_STOP = "direct-stop"  # `gpulaunch stop JOB` of a direct job (its record file)


FAULTS = tuple(Fault)
WATCHER_SIGNALS = {
    Fault.WATCHER_SIGKILL: signal.SIGKILL,
    Fault.WATCHER_SIGTERM: signal.SIGTERM,
    Fault.WATCHER_SIGINT: signal.SIGINT,
    Fault.LATE_SIGTERM: signal.SIGTERM,
    Fault.LATE_SIGINT: signal.SIGINT,
}
LATE = (Fault.LATE_SIGTERM, Fault.LATE_SIGINT)
RANK_FAULTS = {
    Fault.RANK_EXIT: "exit",
    Fault.RANK_SIGKILL: "sigkill",
    Fault.RANK_SIGSEGV: "sigsegv",
}
RESTARTS = {Fault.DBUS_RESTART: "dbus", Fault.JOURNALD_RESTART: "systemd-journald"}
FRONTEND = (
    Fault.FRONTEND_SIGKILL,
    Fault.USER_MANAGER_STOP,
    Fault.USER_MANAGER_REEXEC,
    Fault.LOGOUT,
)
DIRECT = {
    Fault.DIRECT_SIGKILL_CGROUP: "direct-cgroup",
    Fault.DIRECT_SIGKILL_PGROUP: "direct-pgroup",
    Fault.DIRECT_PKILL: "direct-cgroup",
    Fault.DIRECT_STOP: "direct-cgroup",
}
LONG_S = 30.0  # ranks that should be stopped sleep this long; the hang bound is longer
# restart-sigterm: restarts allowed (the gang stop is a restart's), and the variant with
# `--preempt-grace` (then the SIGTERM is a preemption: 79); both longer than any hold.
RESTART_OPTIONS = ("--max-restarts", "2")
PREEMPT_OPTIONS = ("--preempt-grace", "15")
NO_RESTART_CODE = 78  # gpulaunch/recovery/settings.py: an exit code that never restarts


class Phase(enum.StrEnum):
    """When an outside action comes, from what the soak sees."""

    START_UP = "start-up"  # `offset` after the launcher was spawned: imports, planning, units
    RUNNING = "running"  # `offset` after every rank stamped `ready`
    AT_THE_END = "at-the-end"  # `offset` after the failing rank stamped `fault`
    UNITS = "units"  # `offset` after the job slice's cgroup appeared (the units being made)
    GANG_STOP = "gang-stop"  # `offset` after a rank other than the failing one got its SIGTERM


@dataclass(frozen=True)
class JobPlan:
    index: int
    fault: Fault
    nproc: int
    rank_fault: str  # what the rank `fault_rank` does: none, exit, sigkill, sigsegv
    fault_rank: int
    code: int  # its exit code for `exit`
    after_s: float  # it does it this long after its `ready`
    sleep_s: float  # every other rank exits 0 after this long
    phase: Phase | None  # of the outside action; None: there is none
    offset_s: float
    children: int = 0  # processes each rank starts and leaves running (its own children)
    hold_s: float = 0.0  # a rank stopped (SIGTERM/SIGINT) takes this long to exit; 0: at once
    options: tuple[str, ...] = ()  # gpulaunch start's own options beyond the usual ones

    @property
    def launcher(self) -> str:
        """How the job is started: systemd (root), frontend (a user), direct-cgroup/-pgroup."""
        if self.fault in FRONTEND:
            return "frontend"
        return DIRECT.get(self.fault, "systemd")

    def rank_args(self) -> list[str]:
        return [
            *("--fault", self.rank_fault, "--fault-rank", str(self.fault_rank)),
            *("--code", str(self.code), "--after", f"{self.after_s:.3f}"),
            *("--sleep", f"{self.sleep_s:.3f}"),
            *(("--children", str(self.children)) if self.children else ()),
            *(("--hold", f"{self.hold_s:.3f}") if self.hold_s else ()),
        ]

    @property
    def preempt(self) -> bool:
        """Started with --preempt-grace: a SIGTERM to the watcher is a preemption."""
        return PREEMPT_OPTIONS[0] in self.options

    def describe(self) -> str:
        """E.g. `2 ranks; rank 1 exit 37 after 0.42 s; SIGTERM to the watcher, running +0.10 s`."""
        what = [f"{self.nproc} rank{'s' if self.nproc > 1 else ''}"]
        if self.rank_fault == "none":
            what.append(f"ranks exit 0 after {self.sleep_s:.2f} s")
        else:
            code = f" {self.code}" if self.rank_fault == "exit" else ""
            what.append(
                f"rank {self.fault_rank} {self.rank_fault}{code} after {self.after_s:.2f} s"
            )
        if self.children:
            what.append(f"{self.children} children per rank")
        if self.hold_s:
            what.append(f"a stopped rank exits {self.hold_s:.2f} s after its SIGTERM")
        if self.options:
            what.append(" ".join(self.options))
        if self.launcher != "systemd":
            what.append(f"launched {self.launcher}")
        if self.phase is not None:
            what.append(f"{self.action()}, {self.phase} +{self.offset_s:.2f} s")
        return "; ".join(what)

    def action(self) -> str:
        if self.fault in OTHER_ACTIONS:
            return OTHER_ACTIONS[self.fault]
        if self.fault in WATCHER_SIGNALS:
            return f"{WATCHER_SIGNALS[self.fault].name} to the watcher"
        if self.fault is Fault.SLICE_STOP:
            return "systemctl stop of the job slice"
        if self.fault is Fault.GPULAUNCH_STOP:
            return "gpulaunch stop"
        return f"systemctl restart {RESTARTS[self.fault]}"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


OTHER_ACTIONS = {
    Fault.FRONTEND_SIGKILL: "SIGKILL to the front end",
    Fault.USER_MANAGER_STOP: "systemctl stop of the user's manager",
    Fault.USER_MANAGER_REEXEC: "daemon-reexec of the user's manager",
    Fault.LOGOUT: "loginctl terminate-user",
    Fault.DIRECT_SIGKILL_CGROUP: "SIGKILL to the direct watcher",
    Fault.DIRECT_SIGKILL_PGROUP: "SIGKILL to the direct watcher",
    Fault.STOP_AT_START: "systemctl stop of the job slice",
    Fault.RESTART_SIGTERM: "SIGTERM to the watcher",
    Fault.DIRECT_PKILL: "SIGKILL to the direct keeper and watcher together",
    Fault.DIRECT_STOP: "gpulaunch stop",
}


def draw(seed: int, index: int, kinds: tuple[Fault, ...]) -> JobPlan:
    """Job `index`'s plan: only the seed, the index and the kinds decide it."""
    rng = random.Random(f"soak:{seed}:{index}")
    fault = rng.choice(kinds)
    nproc = rng.randint(1, 3)
    fault_rank = rng.randrange(nproc)
    code = rng.randint(1, 255)
    after = rng.uniform(0.2, 0.8)
    base = dict(index=index, fault=fault, nproc=nproc, fault_rank=fault_rank, code=code)
    if fault is Fault.SUCCESS:
        return JobPlan(
            **base, rank_fault="none", after_s=after, sleep_s=after, phase=None, offset_s=0.0
        )
    if fault in RANK_FAULTS:
        return JobPlan(
            **base,
            rank_fault=RANK_FAULTS[fault],
            after_s=after,
            sleep_s=LONG_S,
            phase=None,
            offset_s=0.0,
        )
    if fault is Fault.WATCHER_SIGKILL:
        phase = rng.choice((Phase.START_UP, Phase.RUNNING))
        return JobPlan(
            **base,
            rank_fault="none",
            after_s=after,
            sleep_s=LONG_S,
            phase=phase,
            offset_s=_offset(rng, phase, after),
        )
    if fault in WATCHER_SIGNALS:  # a rank fails too: whichever the watcher saw first counts
        phase = Phase.AT_THE_END if fault in LATE else rng.choice((Phase.START_UP, Phase.RUNNING))
        return JobPlan(
            **base,
            rank_fault="exit",
            after_s=after,
            sleep_s=LONG_S,
            phase=phase,
            offset_s=_offset(rng, phase, after),
        )
    if fault in OTHER_ACTIONS:  # the kinds added for issue 22: drawn after the others'
        return _draw_other(rng, fault, base, after)
    if fault in (Fault.SLICE_STOP, Fault.GPULAUNCH_STOP):
        return JobPlan(
            **base,
            rank_fault="none",
            after_s=after,
            sleep_s=LONG_S,
            phase=Phase.RUNNING,
            offset_s=rng.uniform(0, 0.5),
        )
    # A restart of a service: the job ends as it would have, by success or a rank's exit.
    rank_fault = rng.choice(("none", "exit"))
    sleep = LONG_S if rank_fault == "exit" else after + 0.3
    return JobPlan(
        **base,
        rank_fault=rank_fault,
        after_s=after + 0.3,
        sleep_s=sleep,
        phase=Phase.RUNNING,
        offset_s=rng.uniform(0, 0.3),
    )


def _offset(rng: random.Random, phase: Phase, after: float) -> float:
    if phase is Phase.START_UP:
        return rng.uniform(0, 1.0)  # gpulaunch's imports, planning, the units being made
    if phase is Phase.RUNNING:
        return rng.uniform(0, after)  # before the rank's fault, mostly
    return rng.uniform(0, 0.1)  # as the failure is seen and the report made


def _draw_other(rng: random.Random, fault: Fault, base: dict[str, Any], after: float) -> JobPlan:
    """The plans of the front end's, the direct supervisor's and the early outside stop's kinds."""
    if fault is Fault.USER_MANAGER_REEXEC:  # the job must survive it: its own end
        rank_fault = rng.choice(("none", "exit"))
        phase = rng.choice((Phase.START_UP, Phase.RUNNING))
        return JobPlan(
            **base,
            rank_fault=rank_fault,
            after_s=after + 0.3,
            sleep_s=LONG_S if rank_fault == "exit" else after + 0.3,
            phase=phase,
            offset_s=_offset(rng, phase, after),
        )
    if fault is Fault.RESTART_SIGTERM:
        return _draw_restart(rng, base, after)
    if fault is Fault.STOP_AT_START:
        phase, offset = Phase.UNITS, rng.uniform(0, 0.15)  # issue 22, item 1's window
    else:
        phase, offset = Phase.RUNNING, rng.uniform(0, 0.5)
    children = rng.randint(1, 3) if fault in DIRECT else 0
    return JobPlan(
        **base,
        rank_fault="none",
        after_s=after,
        sleep_s=LONG_S,
        phase=phase,
        offset_s=offset,
        children=children,
    )


def _draw_restart(rng: random.Random, base: dict[str, Any], after: float) -> JobPlan:
    """restart-sigterm (issue 35, item 8): 2-3 ranks, one exits with a code that restarts;
    the others hold 1.5-3 s after their SIGTERM, and the watcher's SIGTERM comes within
    0.5 s of the first one's (well inside the hold: the gang still stops)."""
    base = base | {"nproc": max(base["nproc"], 2)}  # a gang to stop besides the failed rank
    if base["code"] == NO_RESTART_CODE:
        base["code"] = NO_RESTART_CODE - 1
    hold = rng.uniform(1.5, 3.0)
    options = RESTART_OPTIONS + (PREEMPT_OPTIONS if rng.random() < 0.5 else ())
    return JobPlan(
        **base,
        rank_fault="exit",
        after_s=after,
        sleep_s=LONG_S,
        phase=Phase.GANG_STOP,
        offset_s=rng.uniform(0, 0.5),
        hold_s=hold,
        options=options,
    )
