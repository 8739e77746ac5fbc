"""Run one soak job: start it, do its outside action at its instant, see how it ended.

This is measurement code: it waits for stamps and for units to go away by polling, at a
short fixed interval, on purpose (bench/procs.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from bench import frontend, launchers, procs
from bench.launchers import Launcher, Run
from bench.soak.judge import End, Seen, parse_headline
from bench.soak.plan import RESTARTS, WATCHER_SIGNALS, Fault, JobPlan, Phase

RECORD_ID = "74b8d59289c14f16ad639b2abe1d2863"  # README: the record's MESSAGE_ID
POLL_S = 0.01
CGROUP = Path("/sys/fs/cgroup")
# The cgroups the direct watchers run in, as a container's or a CI runner's own: root's
# (writable: the cgroup way), and one an ordinary user cannot write (process groups).
# Fixed, like a container's: a job cgroup left in one blocks the same job id there.
DIRECT_CGROUPS = {
    "direct-cgroup": CGROUP / "soak-direct",
    "direct-pgroup": CGROUP / "soak-direct-pg",
}


@dataclass(frozen=True)
class Bounds:
    hang_s: float = 60.0  # a job not ended this long after its start hangs
    settle_s: float = 10.0  # how long its units and processes may take to go after its end


def run_job(
    plan: JobPlan, scratch: Path, bounds: Bounds, env: Mapping[str, str]
) -> tuple[str, Seen, float]:
    """Run `plan` (`env`: e.g. PYTHONPATH of a snapshot); its job id, what was seen, how long."""
    stamps = scratch / f"job{plan.index}"
    stamps.mkdir()
    stamps.chmod(0o777)  # an ordinary user's ranks stamp here too
    run = _start(plan, stamps, scratch, env)
    t0 = time.monotonic()
    deadline = t0 + bounds.hang_s
    acted, action_rc = False, None
    try:
        if plan.phase is not None and _wait_instant(plan, run, stamps, t0, deadline):
            acted, action_rc = _act(plan, run, deadline, env)
        ended = run.wait_exit(max(deadline - time.monotonic(), 0.0))
    finally:
        if run.exited_at is None:
            run.proc.kill()
    took = time.monotonic() - t0
    # Read after the job's processes are gone: a front end's watcher writes its report to
    # the same stderr, after the front end itself ended (SIGKILLed, its bus gone).
    units, pids = _leftovers(run, plan, bounds.settle_s)
    stderr = launchers.stderr_text(run, scratch)
    headline = parse_headline(run.token, stderr)
    run.close()  # what is left is killed and stopped (counted above)
    _clean_direct(run.token)
    if plan.fault in (Fault.USER_MANAGER_STOP, Fault.LOGOUT):
        frontend.restart_manager()  # for the next job (lingering, as prepared)
    seen = Seen(
        returncode=run.returncode if ended else None,
        stderr=stderr,
        headline=headline,
        # the watcher writes the record before its report: with a report, wait for it
        record=_record(run.token, bounds.settle_s if headline is not None else 0.0),
        leaked_units=tuple(units),
        leaked_procs=pids,
        acted=acted,
        action_rc=action_rc,
        rank_faulted=(stamps / f"fault.{plan.fault_rank}").exists(),
        state_after=_state_after(run, plan, env) if plan.launcher.startswith("direct") else None,
    )
    return run.token, seen, took


def _start(plan: JobPlan, stamps: Path, scratch: Path, env: Mapping[str, str]) -> Run:
    """Start the plan's launcher: as root, as the front end's user, or direct in a cgroup."""
    args = ["--dir", str(stamps), *plan.rank_args()]
    script = launchers.rank_script("soak")
    if plan.launcher == "systemd" and plan.options:  # gpulaunch start's own options first
        token = launchers.new_token("soak")
        argv = launchers.command(Launcher.SYSTEMD, plan.nproc, script, args, token)
        at = argv.index("start") + 1
        argv[at:at] = plan.options
        return launchers.spawn(Launcher.SYSTEMD, token, argv, scratch, False, env)
    if plan.launcher == "systemd":
        return launchers.start(Launcher.SYSTEMD, plan.nproc, script, args, "soak", scratch,
                               extra_env=env)  # fmt: skip
    if plan.launcher == "frontend":
        return launchers.start(Launcher.FRONTEND, plan.nproc, script, args, "soak", scratch,
                               extra_env=env)  # fmt: skip
    token = launchers.new_token("soak")
    argv = launchers.command(Launcher.DIRECT, plan.nproc, script, args, token)
    extra = dict(env)
    if plan.launcher == "direct-pgroup":  # an ordinary user, whose cgroup is root's
        uid, gid = frontend.ids()
        argv = ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--init-groups", *argv]
        extra.update(frontend.login_environment())
    # Into the fixed cgroup first (as root), then exec: the launcher keeps this pid.
    procs_file = DIRECT_CGROUPS[plan.launcher] / "cgroup.procs"
    argv = ["sh", "-c", f'echo $$ > {procs_file} && exec "$@"', "sh", *argv]
    return launchers.spawn(Launcher.DIRECT, token, argv, scratch, False, extra)


def _direct_watcher(keeper: int) -> int:
    """The direct watcher: the only child of `gpulaunch start`, its keeper (else the keeper)."""
    try:
        with open(f"/proc/{keeper}/task/{keeper}/children") as f:
            children = [int(pid) for pid in f.read().split()]
    except OSError:
        return keeper
    return children[0] if children else keeper


def prepare_direct() -> None:
    """The direct watchers' fixed cgroups (the soak's own box: its cgroup tree is its own)."""
    for path in DIRECT_CGROUPS.values():
        path.mkdir(exist_ok=True)


def _direct_cgroups(token: str) -> list[str]:
    """Job cgroups of a direct watcher still there (they would block the job id)."""
    return [str(p) for d in DIRECT_CGROUPS.values() if d.exists() for p in d.glob(f"*{token}*")]


def _clean_direct(token: str) -> None:
    """Remove what a direct job left (counted already), deepest first, so the next runs."""
    for left in _direct_cgroups(token):
        for path in sorted(Path(left).rglob("*"), key=lambda p: -len(p.parts)):
            if path.is_dir():
                _kill_and_rmdir(path)
        _kill_and_rmdir(Path(left))


def _kill_and_rmdir(path: Path) -> None:
    try:
        (path / "cgroup.kill").write_text("1")
    except OSError:
        pass
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            path.rmdir()
            return
        except OSError:
            time.sleep(POLL_S * 5)


def _state_after(run: Run, plan: JobPlan, env: Mapping[str, str]) -> str | None:
    """What `gpulaunch status` says of a direct job now (as its user); None: it knows none."""
    argv = [str(launchers.BIN / "gpulaunch"), "status", "--json", run.token]
    extra = dict(env)
    if plan.launcher == "direct-pgroup":
        uid, gid = frontend.ids()
        argv = ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--init-groups", *argv]
        extra.update(frontend.login_environment())
    done = subprocess.run(
        argv, capture_output=True, text=True, env={**os.environ, **extra}, check=False, timeout=60
    )
    try:
        state = json.loads(done.stdout)["state"]
    except (ValueError, KeyError, TypeError):
        return None
    return str(state)


def _running(run: Run) -> bool:
    return not run.wait_exit(0)


def _wait_instant(plan: JobPlan, run: Run, stamps: Path, t0: float, deadline: float) -> bool:
    """Sleep until the plan's instant; False if the launcher ended first (or the deadline)."""
    if plan.phase is Phase.START_UP:
        at = t0 + plan.offset_s
    elif plan.phase is Phase.UNITS:
        job_slice = CGROUP / "gpulaunch.slice" / f"gpulaunch-{run.token}.slice"
        while not job_slice.exists():
            if not _running(run) or time.monotonic() > deadline:
                return False
            time.sleep(POLL_S / 10)  # the window is ~0.15 s wide
        at = time.monotonic() + plan.offset_s
    elif plan.phase is Phase.GANG_STOP:  # any rank but the failed one told to stop
        others = [stamps / f"term.{r}" for r in range(plan.nproc) if r != plan.fault_rank]
        while not any(p.exists() for p in others):
            if not _running(run) or time.monotonic() > deadline:
                return False
            time.sleep(POLL_S)
        at = time.monotonic() + plan.offset_s
    else:
        names = (
            [f"ready.{r}" for r in range(plan.nproc)]
            if plan.phase is Phase.RUNNING
            else [f"fault.{plan.fault_rank}"]
        )
        while not all((stamps / n).exists() for n in names):
            if not _running(run) or time.monotonic() > deadline:
                return False
            time.sleep(POLL_S)
        at = time.monotonic() + plan.offset_s
    while time.monotonic() < at:
        if not _running(run):
            return False
        time.sleep(min(POLL_S, max(at - time.monotonic(), 0.0)))
    return _running(run)


def _act(
    plan: JobPlan, run: Run, deadline: float, env: Mapping[str, str]
) -> tuple[bool, int | None]:
    """Do the outside action; (done, its command's exit status)."""
    if plan.fault in WATCHER_SIGNALS:
        run.signal(WATCHER_SIGNALS[plan.fault])
        return True, None
    if plan.fault is Fault.FRONTEND_SIGKILL:
        run.signal(signal.SIGKILL)
        return True, None
    if plan.fault is Fault.RESTART_SIGTERM:
        run.signal(signal.SIGTERM)
        return True, None
    if plan.fault is Fault.DIRECT_PKILL:  # as `pkill -9 -f gpulaunch`: both, the keeper first
        watcher = _direct_watcher(run.pid)
        for pid in dict.fromkeys((run.pid, watcher)):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return True, None
    if plan.fault in (Fault.DIRECT_SIGKILL_CGROUP, Fault.DIRECT_SIGKILL_PGROUP):
        # `gpulaunch start` is the keeper there (supervisor/keeper.py): the watcher is its child
        os.kill(_direct_watcher(run.pid), signal.SIGKILL)
        return True, None
    uid, _ = frontend.ids() if plan.launcher == "frontend" else (0, 0)
    if plan.fault is Fault.SLICE_STOP:
        argv = ["systemctl", "stop", f"gpulaunch-{run.token}.slice"]
    elif plan.fault is Fault.STOP_AT_START:
        argv = ["systemctl", "stop", "--no-block", f"gpulaunch-{run.token}.slice"]
    elif plan.fault is Fault.USER_MANAGER_STOP:
        argv = ["systemctl", "stop", f"user@{uid}.service"]
    elif plan.fault is Fault.USER_MANAGER_REEXEC:
        argv = ["systemctl", "--user", "--machine", f"{frontend.USER}@", "daemon-reexec"]
    elif plan.fault is Fault.LOGOUT:
        argv = ["loginctl", "terminate-user", frontend.USER]
    elif plan.fault in (Fault.GPULAUNCH_STOP, Fault.DIRECT_STOP):
        argv = [str(launchers.BIN / "gpulaunch"), "stop", run.token]
    else:
        argv = ["systemctl", "restart", RESTARTS[plan.fault]]
    try:
        done = subprocess.run(
            argv,
            capture_output=True,
            env={**os.environ, **env},
            timeout=max(deadline - time.monotonic(), 1.0),
            check=False,
        )
    except subprocess.TimeoutExpired:
        return True, None
    return True, done.returncode


def _leftovers(run: Run, plan: JobPlan, settle_s: float) -> tuple[list[str], int]:
    """The job's units (a direct job: its cgroups) and processes still there `settle_s`
    after its end (at most)."""
    token = run.token
    until = time.monotonic() + settle_s
    while True:
        if plan.launcher.startswith("direct"):
            units = _direct_cgroups(token)
        else:
            units = launchers.job_units(token, run.launcher)
        pids = procs.job_pids(token)
        if (not units and not pids) or time.monotonic() > until:
            return units, len(pids)
        time.sleep(POLL_S * 5)


def _record(token: str, wait_s: float) -> End | None:
    """The job's journal record (docs/dbus.md), waiting up to `wait_s` for it to appear."""
    until = time.monotonic() + wait_s
    while True:
        out = subprocess.run(
            [
                "journalctl",
                "-o",
                "json",
                "--no-pager",
                f"MESSAGE_ID={RECORD_ID}",
                f"GPULAUNCH_JOB={token}",
            ],  # fmt: skip
            capture_output=True,
            text=True,
            check=False,
        ).stdout
        lines = [json.loads(line) for line in out.splitlines() if line.strip()]
        if lines:
            last = lines[-1]
            rank = last.get("GPULAUNCH_CAUSE_RANK")
            return End(
                int(last["GPULAUNCH_STATUS"]),
                str(last.get("GPULAUNCH_CAUSE")),
                int(rank) if rank not in (None, "") else None,
            )
        if time.monotonic() > until:
            return None
        time.sleep(POLL_S * 10)
