"""GPU leases under a real systemd (issue 28): root's and an ordinary user's jobs share two fake
GPUs (`--machine-root`, tests/fake_machine.py), a third job is refused naming both holders, and a
SIGKILLed watcher's GPU is free for the next job at once (the kernel drops its flock). No
directory under /run/gpulaunch is writable by the user (issue 35): their note is in their own
runtime directory."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from gpulaunch.base.names import UnitNames
from tests.fake_machine import FakeGpu, write_fake_machine
from tests.integration.jobs import GPULAUNCH, RANK_SCRIPT, REPO, Job, wait_until
from tests.integration.shared import box_user

__all__ = ["box_user"]  # a fixture (shared.py)

pytestmark = pytest.mark.integration

BUSES = ["0000:1b:00.0", "0000:3d:00.0"]


def fake_machine(job: Job, gpus: int = 2) -> Path:
    root = write_fake_machine(
        job.dir / "machine",
        [
            FakeGpu(BUSES[0], 0, "GPU-0a0a0a0a-1111-2222-3333-444444444444"),
            FakeGpu(BUSES[1], 1, "GPU-1b1b1b1b-1111-2222-3333-444444444444"),
        ][:gpus],
    )
    for d in (job.dir, *job.dir.rglob("*")):
        if d.is_dir():
            d.chmod(0o777)  # the ordinary user's job writes pid files beside root's
    return root


def start(
    job: Job, job_id: str, machine: Path, prefix: list[str], *opts: str, lingers: bool = False
) -> subprocess.Popen[str]:
    sub = job.dir / job_id
    sub.mkdir(mode=0o777)
    sub.chmod(0o777)
    argv = [GPULAUNCH, "start", "--job", job_id, "--machine-root", str(machine)]
    argv += [*opts, "--gpus", "auto:1", RANK_SCRIPT, "--dir", str(sub), "--sleep", "300"]
    if lingers:  # its rank outlives a SIGTERM by the grace period (3 s), then SIGKILL
        argv[argv.index("--gpus") : argv.index("--gpus")] = ["--grace", "3"]
        argv.append("--ignore-term")
    proc: subprocess.Popen[str] = job.box.popen(
        [*prefix, *argv],
        cwd=str(REPO),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    wait_until(lambda: (sub / "rank0.ready").exists() or proc.poll() is not None, 60, job_id)
    assert proc.poll() is None, proc.communicate()[1]
    return proc


def refused(job: Job, machine: Path) -> str:
    res = job.box.run(
        [GPULAUNCH, "start", "--job", job.id + "-c", "--machine-root", str(machine)]
        + ["--gpus", "auto:1", RANK_SCRIPT, "--dir", str(job.dir), "--sleep", "300"],
        cwd=str(REPO),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 69, res.stderr
    assert res.stderr.count("\n") == 1, res.stderr  # one line
    return res.stderr


def alive(job: Job, pid: str) -> bool:
    return job.box.run(["kill", "-0", pid], capture_output=True).returncode == 0


def holder_pid(line: str, bus: str) -> int:
    found = re.search(rf"\({re.escape(bus)}\): job \S+, user \S+, unit \S+, pid (\d+)", line)
    assert found, line
    return int(found[1])


def test_root_and_a_user_share_the_gpus_and_a_killed_watcher_frees_its_gpu(
    job: Job, box_user: tuple[int, list[str]]
) -> None:
    uid, as_user = box_user
    machine = fake_machine(job)
    runtime = machine / "run/user" / str(uid)  # the user's runtime directory, as logind makes it
    runtime.mkdir(parents=True)
    job.box.run(["chown", f"{uid}:{uid}", str(runtime)], check=True)
    runtime.chmod(0o700)
    a, b = job.id + "-a", job.id + "-b"
    procs = []
    try:
        # root's first: GPU 0 (and root makes the store), then the user's: GPU 1
        procs.append(start(job, a, machine, [], lingers=True))
        procs.append(start(job, b, machine, as_user, lingers=True))
        ranks = {j: (job.dir / j / "rank0.pid").read_text() for j in (a, b)}
        line = refused(job, machine)
        assert f"GPU 0 ({BUSES[0]}): job {a}, user root, unit " in line, line
        assert f"GPU 1 ({BUSES[1]}): job {b}, user gljob, unit " in line, line
        # the user can neither remove, replace nor add a lock file of root's store, nor
        # take root's GPU from under its job
        store = machine / "run/gpulaunch/gpus"
        for attempt in (
            ["rm", "-f", str(store / "nvidia0")],
            ["ln", "-sf", "/dev/null", str(store / "nvidia0")],
            ["touch", str(store / "nvidia7")],
            ["flock", "--nonblock", str(store / "nvidia0"), "true"],
        ):
            res = job.box.run([*as_user, *attempt], capture_output=True, text=True)
            assert res.returncode != 0, attempt
        assert not (store / "nvidia7").exists() and not (store / "nvidia0").is_symlink()
        # issue 35: no directory under /run/gpulaunch is writable by others (a 1777 one let a
        # user fill /run); the user's note is in their own runtime directory, and root's
        # refusal above named the user's job from it
        run = machine / "run/gpulaunch"
        for d in (run, *run.rglob("*")):
            assert not (d.is_dir() and d.stat().st_mode & 0o022), f"{d} is writable by others"
        for d in (run, run / "gpus", run / "holders"):
            res = job.box.run([*as_user, "touch", str(d / "x")], capture_output=True)
            assert res.returncode != 0 and not (d / "x").exists(), d
        notes = [n.name for n in (runtime / "gpulaunch/holders").iterdir()]
        assert notes == [str(holder_pid(line, BUSES[1]))], notes
        # and the machine's own /run/gpulaunch, where root's jobs keep their records, error
        # files and progress sockets: nothing there that others may write either, once this
        # version's tmpfiles.d entry is applied as `gpulaunch setup` and the .deb do (over
        # what an older entry in the host's /etc, which the box boots with, made)
        conf = str(REPO / "packaging/tmpfiles.d/gpulaunch.conf")
        job.box.run(["systemd-tmpfiles", "--create", conf], capture_output=True)
        found = job.box.run(
            ["find", "/run/gpulaunch", "-type", "d", "-perm", "/022"],
            capture_output=True,
            text=True,
            check=True,
        )
        assert found.stdout == "", found.stdout
        for victim, bus, name in ((procs[1], BUSES[1], b), (procs[0], BUSES[0], a)):
            pid = holder_pid(line, bus)  # the watcher, as the kernel's /proc/locks names it
            job.box.run(["kill", "-KILL", str(pid)], check=True)
            d = job.id + "-d" + bus[5:7]
            # its GPU goes to the next job once the last process of the killed job, its rank
            # (stopped by systemd: BindsTo=, SIGKILLed after its grace), is gone; not before
            procs.append(start(job, d, machine, [], "--wait-for-gpus"))
            assert not alive(job, ranks[name]), f"{name}'s rank still runs"
            line = refused(job, machine)
            assert f"({bus}): job {d}, user root" in line, line
            victim.wait(60)
    finally:
        for name in (a, b, job.id + "-d1b", job.id + "-d3d"):
            slice_ = UnitNames.for_job(name).job_slice
            job.box.run(["systemctl", "stop", slice_], capture_output=True)
            job.box.run([*as_user, "systemctl", "--user", "stop", slice_], capture_output=True)
        for proc in procs:
            proc.communicate(timeout=60)


def test_direct_supervisor_a_killed_watchers_gpu_is_freed_after_its_ranks(job: Job) -> None:
    """Under the direct supervisor the lease's holders are the keeper (which took it), the
    watcher and the rank: SIGKILL the watcher, and the keeper stops the rank and ends."""
    machine = fake_machine(job, gpus=1)
    a, b = job.id + "-a", job.id + "-b"
    procs = [start(job, a, machine, [], "--supervisor", "direct", lingers=True)]
    pids = [(job.dir / a / "rank0.pid").read_text()]
    try:
        keeper = holder_pid(refused(job, machine), BUSES[0])
        res = job.box.run(["pgrep", "-P", str(keeper)], capture_output=True, text=True)
        watcher = res.stdout.split()[0]
        pids += [str(keeper), watcher]
        job.box.run(["kill", "-KILL", watcher], check=True)
        procs.append(start(job, b, machine, [], "--wait-for-gpus"))
        assert not alive(job, pids[0]), "the killed job's rank still runs"
        assert not alive(job, str(keeper)), "its keeper still runs"
    finally:
        job.box.run(["kill", "-KILL", *pids], capture_output=True)
        job.box.run(["systemctl", "stop", UnitNames.for_job(b).job_slice], capture_output=True)
        for proc in procs:
            proc.communicate(timeout=60)
