"""What every scenario gets: the sizes and repetitions to use, a scratch directory, progress."""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench import launchers, machine
from bench.launchers import LAUNCHERS, Launcher, Node, Run


@dataclass(frozen=True)
class Config:
    """Sizes and repetitions; `quick` is a smoke test.

    On 2 CPUs the full run of scenarios 1-6 fits in 10 minutes; scenario 7 adds about 9
    (torchrun's `busy` variant waits out `node_cap_s` in every repetition).
    """

    reps: int = 5
    failure_nproc: int = 4
    kill_nproc: int = 4
    kill_cap_s: float = 5.0  # how long we wait for torchrun's orphans before killing them
    launch_sizes: tuple[int, ...] = (8, 64)
    footprint_nproc: int = 4
    footprint_job_s: float = 30.0
    footprint_reps: int = 1  # a 30 s job per launcher; the sampling makes one run enough
    output_nproc: int = 4
    output_lines: int = 200_000  # per rank
    scale_nproc: int = 64
    node_cap_s: float = 60.0  # how long after the failure we wait for the other nodes (7)
    nodes_sizes: tuple[int, ...] = (2, 8, 32)  # scenario 8: nodes of 8 ranks on this machine
    nodes_reps: int = 1  # each run of 32 nodes starts 256 ranks (and 32 torchrun agents)
    run_cap_s: float = 180.0  # runaway protection for one run, never a measurement

    @classmethod
    def quick(cls) -> Config:
        return cls(
            reps=1,
            kill_cap_s=3.0,
            launch_sizes=(8, 16),
            footprint_job_s=5.0,
            output_lines=20_000,
            scale_nproc=16,
            node_cap_s=20.0,
            nodes_sizes=(2,),
        )

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Context:
    config: Config
    scratch: Path
    problems: list[str] = field(default_factory=list)  # anomalies worth reporting
    # The launchers of the scenario that runs now (its own, less those not available here).
    launchers: tuple[Launcher, ...] = LAUNCHERS
    launch_env: dict[str, str] = field(default_factory=dict)  # e.g. PYTHONPATH of a snapshot
    # Share of the machine's CPUs that other work used during each run: (what, launcher, share).
    run_loads: list[tuple[str, Launcher, float]] = field(default_factory=list)
    _cpu_at_start: dict[str, machine.CpuReading] = field(default_factory=dict)

    def start(
        self,
        launcher: Launcher,
        nproc: int,
        script: str,
        args: Sequence[str],
        label: str,
        capture: bool = False,
        tee: bool = False,
    ) -> Run:
        """Start a run of `script` under `launcher` (bench/launchers.py), logs in the scratch."""
        reading = machine.read_cpu()
        run = launchers.start(
            launcher,
            nproc,
            launchers.rank_script(script),
            args,
            label,
            self.scratch,
            capture=capture,
            extra_env=self.launch_env,
            tee=tee,
        )
        self._cpu_at_start[run.token] = reading
        return run

    def start_node(
        self, launcher: Launcher, node: Node, nproc: int, script: str, args: Sequence[str]
    ) -> Run:
        """Start one node's launcher of a multi-node job (launchers.py), logs in the scratch.

        The other work on the machine is measured once per job: over node 0's run.
        """
        reading = machine.read_cpu()
        run = launchers.start_node(
            launcher,
            node,
            nproc,
            launchers.rank_script(script),
            args,
            self.scratch,
            extra_env=self.launch_env,
        )
        if node.rank == 0:
            self._cpu_at_start[run.token] = reading
        return run

    def order(self, rep: int) -> tuple[Launcher, ...]:
        """This repetition's launchers, in the order to run them (launchers.order)."""
        return launchers.order(rep, self.launchers)

    def say(self, text: str) -> None:
        print(f"bench: {time.strftime('%H:%M:%S')} {text}", file=sys.stderr, flush=True)

    def run_dir(self, token_label: str) -> Path:
        """A fresh directory for one run's stamps, visible to its ranks."""
        d = self.scratch / f"{token_label}-{time.monotonic_ns()}"
        d.mkdir(parents=True)
        d.chmod(0o777)  # the front end's ranks run as an ordinary user
        return d

    def finish(self, run: Run, what: str, leftovers_expected: bool = False) -> None:
        """Clean up after a run; anything that had to be cleaned up is a problem to report."""
        leftovers = run.close()
        if leftovers and not leftovers_expected:
            self.problem(f"{what} ({run.launcher}): " + "; ".join(leftovers))
        start = self._cpu_at_start.pop(run.token, None)
        if start is not None:
            _, share = machine.other_load(start, machine.read_cpu())
            self.run_loads.append((what, run.launcher, share))

    def problem(self, text: str) -> None:
        self.problems.append(text)
        self.say(f"NOTE: {text}")

    def check_status(self, run: Run, what: str, expected: set[int]) -> None:
        """A launcher exit status other than the expected ones is reported, with its stderr."""
        if run.returncode not in expected:
            tail = launchers.stderr_tail(run, self.scratch)
            self.problem(f"{what} ({run.launcher}) exited {run.returncode}: {tail[-600:]}")


def fmt(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"
