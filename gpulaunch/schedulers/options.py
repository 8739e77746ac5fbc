"""`start --termination-log PATH`, `--gpu-job-map DIR` (gpulaunch/schedulers/).

Light on purpose: cli.py imports it for every command.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from pathlib import Path

from gpulaunch.errors import UsageError

JOB_MAP_ENV = "GPULAUNCH_GPU_JOB_MAP"  # an admin's setting for every job of a machine


@dataclass(frozen=True)
class SchedulerOptions:
    """What the job hands the cluster's tools; None: not asked for (the defaults apply)."""

    termination_log: Path | None = None  # Kubernetes' message (termination.py)
    gpu_job_map: Path | None = None  # DCGM's GPU -> job files (jobmap.py)


def _directory(text: str) -> Path:
    path = Path(text)
    if not text or not path.is_absolute():
        raise argparse.ArgumentTypeError(f"use an absolute directory, not {text!r}")
    return path


def add_scheduler_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("schedulers (docs/environments.md, 'What schedulers read')")
    g.add_argument(
        "--termination-log",
        type=Path,
        metavar="PATH",
        help="write how the job ended (at most 4 KiB: cause, rank, node, status, attempt, the "
        "error's last lines) to PATH, as Kubernetes shows it in the pod's status (default: "
        "$GPULAUNCH_TERMINATION_LOG, else /dev/termination-log where it exists)",
    )
    g.add_argument(
        "--gpu-job-map",
        type=_directory,
        metavar="DIR",
        help="keep DIR/<GPU index> naming the jobs on each of the job's GPUs while it runs, "
        "for dcgm-exporter's --hpc-job-mapping-dir (default: $GPULAUNCH_GPU_JOB_MAP)",
    )


def scheduler_options(args: argparse.Namespace) -> SchedulerOptions:
    job_map = args.gpu_job_map
    if job_map is None and os.environ.get(JOB_MAP_ENV):
        job_map = _directory(os.environ[JOB_MAP_ENV])
    return SchedulerOptions(args.termination_log, job_map)


def check_scheduler_options(options: SchedulerOptions) -> None:
    """Bad input, before anything starts: one line (exit 2)."""
    directory = options.gpu_job_map
    if directory is not None and not directory.is_dir():
        raise UsageError(
            f"--gpu-job-map {directory}: no such directory",
            "create it (dcgm-exporter reads it: --hpc-job-mapping-dir), or leave the option out",
        )
