"""Kubernetes' termination message: how the job ended, in the 4 KiB a pod's status shows.

The kubelet copies the first 4096 bytes of a container's `terminationMessagePath`
(`/dev/termination-log` by default) into the pod's status, where `kubectl describe pod`
and an operator's dashboard show it beside the exit code that pod failure policies and
JobSet's in-place restarts key on (docs/multinode.md, "Kubernetes"). gpulaunch writes one
for every way a job ends: its headline (cause and status), the failing rank and node, the
attempt, and the last lines of the cause's error, cut from the top so that its end (the
exception) is kept.

Where: `--termination-log PATH`, else `$GPULAUNCH_TERMINATION_LOG`, else
`/dev/termination-log` where it exists (the kubelet mounts it as a file into every
container); nowhere else, so that a job outside a pod writes nothing.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from gpulaunch.model import Cause, JobReport, signal_name
from gpulaunch.report import headline

LIMIT = 4096  # bytes the kubelet keeps (k8s.io/api core/v1: TerminationMessagePath)
KUBERNETES_PATH = Path("/dev/termination-log")
ENV = "GPULAUNCH_TERMINATION_LOG"
ERROR_LINES = 20  # at most this many of the error's last lines


def termination_path(option: Path | None, environ: Mapping[str, str]) -> Path | None:
    """Where this job's termination message goes, or None (not in a pod, none asked for)."""
    if option is not None:
        return option
    if environ.get(ENV):
        return Path(environ[ENV])
    return KUBERNETES_PATH if KUBERNETES_PATH.is_file() else None


def _where(report: JobReport) -> list[str]:
    """The failing rank, its node, and the attempt: one line."""
    parts: list[str] = [f"cause: {report.cause}", f"status {report.status}"]
    failure = report.node_failure
    if report.cause is Cause.NODE_FAILED and failure is not None:
        if failure.rank is not None:
            parts.append(f"rank {failure.rank}")
        parts.append(f"node {failure.node} ({failure.host})" if failure.node >= 0 else "")
    elif report.cause_rank is not None:
        parts.append(f"rank {report.cause_rank}")
        if report.layout is not None:
            node = report.layout.this_node
            parts.append(f"node {report.layout.node_rank} ({node.host})")
    attempt = report.restarts + 1
    parts.append(f"attempt {attempt}" + (f" ({report.restarts} restarted)" if attempt > 1 else ""))
    return ["; ".join(p for p in parts if p)]


def _error(report: JobReport) -> tuple[str, list[str]] | None:
    """The cause's error: where it came from, and its lines."""
    failure = report.node_failure
    if report.cause is Cause.NODE_FAILED and failure is not None and failure.error:
        return f"rank {failure.rank}'s error ({failure.error_source})", failure.error.splitlines()
    for rank in report.ranks:
        if rank.error and rank.rank == report.cause_rank:
            return f"rank {rank.rank}'s error ({rank.error_source})", rank.error.splitlines()
    if report.error:  # a start that failed: gpulaunch's own line
        return "the error", report.error.splitlines()
    return None


def termination_message(report: JobReport) -> str:
    """The message, at most LIMIT bytes of UTF-8: what the pod's status shows."""
    head = [headline(report).removeprefix("gpulaunch: "), *_where(report)]
    if report.recovery:
        head.append(report.recovery.removeprefix("gpulaunch: "))
    text = "\n".join(head) + "\n"
    error = _error(report)
    if error is not None:
        title, lines = error
        lines = lines[-ERROR_LINES:]
        room = LIMIT - len(text.encode()) - len(title.encode()) - 2
        kept: list[str] = []
        for line in reversed(lines):  # the last lines first: the exception is at the end
            size = len(line.encode()) + 3
            if size > room:
                break
            kept.insert(0, line)
            room -= size
        if kept:
            text += f"{title}:\n" + "".join(f"  {line}\n" for line in kept)
    data = text.encode()
    if len(data) > LIMIT:  # a head longer than the limit (a very long job id)
        data = data[:LIMIT]
    return data.decode(errors="ignore")


def killed_watcher_message(job: str, sig: int) -> str:
    """What the keeper writes when the watcher was killed (it could write nothing itself)."""
    status = 128 + sig
    return (
        f"job {job} ended: its watcher was killed by {signal_name(sig)} (status {status}); "
        f"its keeper ended what was left of its ranks\ncause: watcher-killed; status {status}\n"
    )[:LIMIT]


def write_message(path: Path, text: str) -> str | None:
    """Write it (the file replaced, never appended to); why not, as a line, or None."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
    except OSError as exc:
        return f"cannot write the termination message to {path}: {exc.strerror}"
    return None
