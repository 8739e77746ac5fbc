"""DCGM's job map: one file per GPU naming the jobs on it (`--gpu-job-map DIR`).

dcgm-exporter labels each GPU's series with the jobs on it when it is given a directory
(`--hpc-job-mapping-dir`, `DCGM_HPC_JOB_MAPPING_DIR`) holding one file per GPU, named by
the GPU's index (nvidia-smi's numbering, as the exporter's `gpu` label), each line a job
(`hpc_job="..."`). A Slurm prolog usually writes it; gpulaunch knows exactly which GPUs a
job's ranks hold, so it keeps the map itself: the job's line is added before its first
rank starts and removed when the job ends, also when its watcher was SIGKILLed (the
anchor under systemd, the keeper under the direct supervisor: `remove_program`).

Several jobs may share a GPU: every change is a read-modify-rename of that GPU's file
under an exclusive flock of `DIR/.gpulaunch.lock` (a name the exporter ignores: not a
number), so no writer loses another's line and the exporter never reads half a file.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

LOCK = ".gpulaunch.lock"


@contextmanager
def _locked(directory: Path) -> Iterator[None]:
    fd = os.open(directory / LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _lines(path: Path) -> list[str]:
    try:
        return [line for line in path.read_text().splitlines() if line]
    except FileNotFoundError:
        return []


def _write(path: Path, lines: list[str]) -> None:
    if not lines:
        path.unlink(missing_ok=True)
        return
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.unlink(missing_ok=True)  # a crashed writer's: never followed (O_EXCL | O_NOFOLLOW)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    with os.fdopen(os.open(tmp, flags, 0o644), "w") as out:
        out.write("".join(f"{line}\n" for line in lines))
    os.replace(tmp, path)


def add_job(directory: Path, job: str, gpus: Iterable[int]) -> None:
    """`job` on each of `gpus` (indices), beside the jobs already there."""
    with _locked(directory):
        for gpu in sorted(set(gpus)):
            path = directory / str(gpu)
            lines = _lines(path)
            if job not in lines:
                _write(path, [*lines, job])


def remove_job(directory: Path, job: str, gpus: Iterable[int]) -> None:
    """`job` off each of `gpus`; a GPU's file goes with its last job."""
    with _locked(directory):
        for gpu in sorted(set(gpus)):
            path = directory / str(gpu)
            lines = _lines(path)
            if job in lines:
                _write(path, [line for line in lines if line != job])


def jobs_on(directory: Path) -> dict[int, list[str]]:
    """The map as dcgm-exporter reads it: GPU index -> its jobs."""
    found: dict[int, list[str]] = {}
    for entry in directory.iterdir():
        if entry.name.isdigit() and entry.is_file():
            found[int(entry.name)] = _lines(entry)
    return found


def cleanup_argv(python: str, directory: Path, job: str, gpus: Iterable[int]) -> list[str]:
    """The command that takes `job` off the map after its watcher is gone, whatever killed it
    (the anchor's ExecStopPost=, units/anchor.service): this module as a script, with no
    import of gpulaunch (-I -S), so that nothing of the user's environment runs as root."""
    return [python, "-I", "-S", __file__, "remove", str(directory), job, *map(str, sorted(gpus))]


if __name__ == "__main__":  # cleanup_argv's command
    import sys

    _, verb, directory, job, *indices = sys.argv
    assert verb == "remove"
    remove_job(Path(directory), job, (int(i) for i in indices))
