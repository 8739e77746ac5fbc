"""Kubernetes' termination message as a pod gets it: gpulaunch the entry point (PID 1) of a
podman container of the example image, /dev/termination-log a file mounted over it as the
kubelet mounts one, and every way a job ends: success, a rank's exit 3, an OOM kill, a
preemption (`podman stop`'s SIGTERM with --preempt-grace) and a crash loop. The message
must fit the 4 KiB the pod's status keeps and name the cause (issue 38)."""

from __future__ import annotations

import shlex
import uuid

import pytest

from sdbox.vm import Machine
from tests.vm.podman import JOB_DIR, deb, image, run_job

__all__ = ["deb", "image"]  # the session's image, built once (tests/vm/podman.py)

LIMIT = 4096


def _log(vm: Machine, job: str) -> str:
    path = f"{JOB_DIR}/termination-{job}"
    vm.run(f"rm -f {path} && touch {path}", check=True)
    return path


def _message(vm: Machine, path: str) -> list[str]:
    size = int(vm.run(f"stat -c %s {path}", check=True).stdout)
    assert 0 < size <= LIMIT, size
    return vm.run(f"cat {path}", check=True).stdout.splitlines()


ENDS = [  # the script's mode, podman's options, gpulaunch's, the status, the message's start
    ("", (), (), 0, "job {job} succeeded (all 2 ranks exited 0)", "succeeded"),
    ("--fail", (), (), 3, "job {job} failed: rank 1 exit 3 (status 3)", "rank-failed"),
    ("--oom", ("--memory", "400m"), (), 137, "job {job} failed: rank 1 SIGKILL", "rank-failed"),
    ("--fail", (), ("--max-restarts", "5"), 80, "job {job} failed in a crash loop", "crash-loop"),
]


@pytest.mark.parametrize(
    ("mode", "podman", "options", "status", "first", "cause"),
    ENDS,
    ids=["success", "exit-3", "oom", "crash-loop"],
)
def test_every_end_is_in_the_termination_message(
    vm: Machine, image: str, mode: str, podman: tuple[str, ...], options: tuple[str, ...],
    status: int, first: str, cause: str,
) -> None:  # fmt: skip
    job = f"tm-{uuid.uuid4().hex[:6]}"
    path = _log(vm, job)
    mount = ("-v", f"{path}:/dev/termination-log")  # as the kubelet mounts it
    args = (mode,) if mode else ()
    code, out = run_job(vm, image, job, *args, podman=(*mount, *podman), options=options)
    assert code == status, out
    lines = _message(vm, path)
    assert lines[0].startswith(first.format(job=job)), (lines, out)
    assert lines[1].startswith(f"cause: {cause}; status {status}"), lines
    if status:
        assert "; rank 1; attempt " in lines[1], lines
    if cause == "crash-loop":
        assert "attempt 3 (2 restarted)" in lines[1], lines


def test_a_preempted_pod_says_so(vm: Machine, image: str) -> None:
    """`podman stop` (the kubelet's SIGTERM to PID 1), --preempt-grace: the ranks save, 79."""
    job = f"tmp-{uuid.uuid4().hex[:6]}"
    path = _log(vm, job)
    name = f"gl-{job}"
    argv = ["podman", "run", "-d", "--name", name, "--network", "host",
            "-v", f"{JOB_DIR}:/srv/job:ro", "-v", f"{path}:/dev/termination-log",
            "-w", "/srv/job", image, "gpulaunch", "start", "--job", job, "--nproc", "2",
            "--preempt-grace", "30", "train.py", "--preempt"]  # fmt: skip
    vm.run(shlex.join(argv), check=True)
    try:
        began = vm.run(
            f"for i in $(seq 600); do podman logs {name} 2>&1 | grep -c 'rank . of 2' | grep -q 2"
            " && exit 0; sleep 0.5; done; exit 1",
            timeout=400,
        )
        assert began.returncode == 0, vm.run(f"podman logs {name} 2>&1").stdout
        vm.run(f"podman stop -t 60 {name}", check=True, timeout=120)
        code = int(vm.run(f"podman wait {name}", check=True).stdout.strip())
        out = vm.run(f"podman logs {name} 2>&1").stdout
        assert code == 79, out
    finally:
        vm.run(f"podman rm -f {name}")
    lines = _message(vm, path)
    assert lines[0] == f"job {job} preempted (status 79: requeue it)", lines
    assert lines[1].startswith("cause: preempted; status 79"), lines
