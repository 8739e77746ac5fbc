"""From command-line options to a `JobSpec` and the units it will create.

Everything a job needs is decided here, before anything starts: a bad option,
a missing script or a bad template fails here and leaves nothing behind.
"""

from __future__ import annotations

import os
import re
import secrets
import socket
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from gpulaunch.environment import RankPlace, rank_environment
from gpulaunch.errors import UsageError
from gpulaunch.model import JobSpec, Manager, RankSpec
from gpulaunch.names import UnitNames, validate_job_id
from gpulaunch.units import Templates, UnitDefinition


@dataclass(frozen=True)
class StartOptions:
    """What the user asked for on the command line (parsed, not yet checked)."""

    script: str
    args: tuple[str, ...]
    nproc: int
    job: str | None
    master_addr: str
    master_port: int | None
    grace_sec: float
    manager: Manager
    memory_max: str | None = None
    units_dirs: tuple[Path, ...] = ()


def generated_job_id(script: str) -> str:
    """`<script stem>_<6 hex>`: readable, unique, and needing no escaping."""
    stem = re.sub(r"[^A-Za-z0-9_]+", "_", Path(script).stem).strip("_") or "job"
    return f"{stem[:40]}_{secrets.token_hex(3)}"


def free_port(addr: str) -> int:
    """A TCP port that is free on `addr` now (as torchrun --standalone picks one)."""
    with socket.socket(socket.AF_INET6 if ":" in addr else socket.AF_INET) as sock:
        try:
            sock.bind((addr, 0))
        except OSError as exc:
            raise UsageError(
                f"cannot bind to --master-addr {addr}: {exc.strerror}",
                "use an address of this machine, e.g. 127.0.0.1",
            ) from exc
        port: int = sock.getsockname()[1]
        return port


def make_spec(opts: StartOptions, base_env: Mapping[str, str], cwd: str) -> JobSpec:
    """Check the options and plan every rank."""
    if opts.nproc < 1:
        raise UsageError(f"--nproc must be at least 1, not {opts.nproc}")
    if opts.grace_sec < 0:
        raise UsageError(f"--grace must not be negative, not {opts.grace_sec:g}")
    if opts.master_port is not None and not 0 < opts.master_port < 65536:
        raise UsageError(f"--master-port must be between 1 and 65535, not {opts.master_port}")
    script = Path(cwd, opts.script)
    if not script.is_file():
        what = "is a directory" if script.is_dir() else "does not exist"
        raise UsageError(f"script {opts.script} {what}", "give the path of a Python script")
    job = opts.job if opts.job is not None else generated_job_id(opts.script)
    problem = validate_job_id(job)
    if problem:
        raise UsageError(f"invalid --job {job!r}: {problem}")
    names = UnitNames.for_job(job)
    port = opts.master_port if opts.master_port is not None else free_port(opts.master_addr)
    argv = (sys.executable, "-u", opts.script, *opts.args)
    ranks = tuple(
        RankSpec(
            rank=i,
            local_rank=i,
            unit=names.rank_scope(i),
            argv=argv,
            env=rank_environment(
                base_env,
                RankPlace(rank=i, local_rank=i, world_size=opts.nproc, local_world_size=opts.nproc),
                job=job,
                unit=names.rank_scope(i),
                master_addr=opts.master_addr,
                master_port=port,
            ),
        )
        for i in range(opts.nproc)
    )
    return JobSpec(
        job=job,
        names=names,
        manager=opts.manager,
        argv=argv,
        cwd=cwd,
        nproc=opts.nproc,
        world_size=opts.nproc,
        master_addr=opts.master_addr,
        master_port=port,
        grace_sec=opts.grace_sec,
        ranks=ranks,
        memory_max=opts.memory_max,
    )


@dataclass(frozen=True)
class JobUnits:
    """The rendered definitions of every unit of one job."""

    job_slice: UnitDefinition
    ranks_slice: UnitDefinition
    watcher: UnitDefinition
    ranks: tuple[UnitDefinition, ...]

    def all(self) -> Sequence[UnitDefinition]:
        return (self.job_slice, self.watcher, self.ranks_slice, *self.ranks)


def render_units(spec: JobSpec, templates: Templates) -> JobUnits:
    """Render the four templates for this job (DESIGN.md: templates are the source of truth)."""
    names = spec.names
    common: dict[str, object] = {
        "job": spec.job,
        "job_slice": names.job_slice,
        "ranks_slice": names.ranks_slice,
        "watcher_scope": names.watcher_scope,
        "world_size": spec.world_size,
        "nproc": spec.nproc,
        "grace_sec": spec.grace_sec,
        "argv": list(spec.argv),
        "memory_max": spec.memory_max,
        "job_memory_max": None,
        "description": " ".join(spec.argv[2:]) if len(spec.argv) > 2 else " ".join(spec.argv),
    }
    rank_units = tuple(
        templates.render(
            "rank.scope",
            rank.unit,
            {
                **common,
                "unit": rank.unit,
                "rank": rank.rank,
                "local_rank": rank.local_rank,
                "gpu": None,
                "cpus": None,
                "device_allow": [],
            },
        )
        for rank in spec.ranks
    )
    return JobUnits(
        job_slice=templates.render("job.slice", names.job_slice, common),
        ranks_slice=templates.render("ranks.slice", names.ranks_slice, common),
        watcher=templates.render(
            "watcher.scope", names.watcher_scope, {**common, "unit": names.watcher_scope}
        ),
        ranks=rank_units,
    )


def default_environment() -> dict[str, str]:
    """The launcher's own environment, which every rank starts from."""
    return dict(os.environ)
