"""The keeper: what outlives a direct supervisor's watcher and ends what it leaves.

Under systemd the anchor service outlives a SIGKILLed watcher (anchor.py). The
direct supervisor has no manager to do that, and PR_SET_PDEATHSIG reaches only
the watcher's own children (the ranks), not what they started: a dataloader
worker, a `subprocess` child, a setsid daemon. An orphan goes to its nearest
*subreaper ancestor* (prctl(2) PR_SET_CHILD_SUBREAPER), else to init; so what
survives the watcher and can find all of them must be an ancestor of the ranks.

`fork_keeper()` forks once, before the job has any process or cgroup: the
*parent* (the process the user started, its pid the one the shell knows)
becomes the keeper, the child goes on as the watcher and forks the ranks::

    gpulaunch start (keeper: subreaper, one small loop)
    └─ gpulaunch start (watcher)
       ├─ rank 0 ─ worker, subprocess child, ... (setsid daemons come back to the
       └─ rank 1   watcher, and when it is gone, to the keeper)

The keeper sleeps in sigwaitinfo(2) until the watcher ends. Then every process
below it (anything of the job, wherever in the tree it went: an orphan comes to
the keeper) gets SIGKILL until none is left; the job's cgroup (the cgroup way),
which the watcher announced over a pipe, is emptied and removed; the job's
error-file directory too. Then the keeper exits with the watcher's exact status
(a signal: the same signal). The watcher is a process group of its own, so
that a signal for the job's process group (the terminal's ^C, bash's `kill %1`)
reaches the keeper alone; the keeper passes every signal it gets on to the
watcher (`kill $!` too): each reaches the watcher once, and a second one still
means "kill now". Inside a resource manager's step it passes none on: Slurm
signals every process of the step itself, the watcher too.

The watcher gets PR_SET_PDEATHSIG SIGTERM: a keeper SIGKILLed stops the job as
a SIGTERM would, with its grace period, and the watcher (a subreaper itself)
ends everything of the ranks as for any stop. Both killed at once (`pkill -9 -f
gpulaunch`): the sentinel the keeper started ends the job's cgroup
(supervisor/sentinel.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import signal
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import NoReturn

from gpulaunch.linux import become_subreaper, set_parent_death_signal
from gpulaunch.supervisor.cgroups import Cgroup, remove_when_empty
from gpulaunch.supervisor.pgroups import descendants, signal_all
from gpulaunch.supervisor.sentinel import spawn_sentinel, tell_sentinel

CLEANUP_TIMEOUT = 5.0  # seconds to wait for killed processes to leave a cgroup
RELAYED = (
    signal.SIGINT,
    signal.SIGTERM,
    signal.SIGHUP,
    signal.SIGQUIT,
    signal.SIGUSR1,
    signal.SIGUSR2,
)
WAITED = (signal.SIGCHLD, *RELAYED)


@dataclass
class KeeperLink:
    """The watcher's end: tells the keeper what to clean up if the watcher dies."""

    pid: int  # the keeper's (the watcher's parent)
    fd: int  # write end of the pipe to the keeper
    sentinel: int = -1  # write end of the sentinel's pipe (supervisor/sentinel.py)

    def tell(self, **message: object) -> None:
        """One message (a JSON line); never blocks, never fails the job. The job's cgroup
        goes to the sentinel too."""
        with contextlib.suppress(OSError):
            os.write(self.fd, json.dumps(message).encode() + b"\n")
        if "cgroup" in message:
            tell_sentinel(self.sentinel, str(message["cgroup"]))

    def companions(self) -> tuple[int, ...]:
        """The keeper and its other children (the sentinel): the processes that share the
        watcher's cgroup before it makes the job's, and must leave it with the watcher (a
        cgroup with processes of its own cannot hand controllers to its children)."""
        try:
            children = Path(f"/proc/{self.pid}/task/{self.pid}/children").read_text().split()
        except OSError:
            children = []
        return (self.pid, *(int(c) for c in children if int(c) != os.getpid()))

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


@dataclass
class Leftovers:
    """What the watcher said it made and not yet removed."""

    job_cgroup: Path | None = None
    own_cgroup: Path | None = None
    enabled: list[tuple[Path, str]] = field(default_factory=list)  # (cgroup, controller)

    def take(self, message: Mapping[str, object]) -> None:
        if "cgroup" in message:
            self.job_cgroup = Path(str(message["cgroup"]))
            self.own_cgroup = Path(str(message["own"]))
        elif "enabled" in message:
            pair = message["enabled"]
            if isinstance(pair, list) and len(pair) == 2:
                self.enabled.insert(0, (Path(str(pair[0])), str(pair[1])))
        elif "released" in message:
            self.job_cgroup = None
            self.enabled.clear()


def fork_keeper(in_step: bool, at_end: Callable[[int], object]) -> KeeperLink:
    """Fork: returns in the child (the watcher); the parent keeps and never returns.

    `in_step`: inside a resource manager's step, whose signals reach every process
    of it (the watcher too): the keeper passes none on. `at_end`: run once the
    watcher and every process below it are gone, with the watcher's wait status
    (watcher/keep.py: prune dead watchers' error-file directories, watcher/errorfile.py; what
    the cluster's tools read, gpulaunch/schedulers/).
    """
    sys.stdout.flush()
    sys.stderr.flush()
    read_end, write_end = os.pipe2(os.O_CLOEXEC)
    os.set_blocking(write_end, False)
    # for the death of both of us (supervisor/sentinel.py): forked after the watcher, so
    # that the watcher stays the keeper's first child
    sentinel_r, sentinel = os.pipe2(os.O_CLOEXEC)
    before = signal.pthread_sigmask(signal.SIG_BLOCK, WAITED)  # none lost before sigwait
    keeper = os.getpid()
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        with contextlib.suppress(OSError):
            os.setpgid(0, 0)  # the job's process group's signals reach the keeper alone
        signal.pthread_sigmask(signal.SIG_SETMASK, before)
        set_parent_death_signal(signal.SIGTERM)
        if os.getppid() != keeper:  # it died before the line above
            os.kill(os.getpid(), signal.SIGTERM)
        os.close(sentinel_r)
        return KeeperLink(keeper, write_end, sentinel)
    os.close(write_end)
    spawn_sentinel(sentinel_r)
    try:
        _keep(pid, read_end, in_step, at_end, sentinel)
    finally:
        os._exit(70)  # pragma: no cover - _keep never returns


def _keep(  # pragma: no cover - the keeper
    watcher: int, messages: int, in_step: bool, at_end: Callable[[int], object], sentinel: int
) -> NoReturn:
    with contextlib.suppress(ValueError, OSError):
        signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    kept = sorted({messages, sentinel} - {-1})  # the sentinel's: held until we end
    for low, high in zip([2, *kept], [*kept, os.sysconf("SC_OPEN_MAX")], strict=True):
        os.closerange(low + 1, high)
    with contextlib.suppress(OSError):  # stdout's reader sees its end with the watcher's
        null = os.open(os.devnull, os.O_RDWR)
        os.dup2(null, 0)
        os.dup2(null, 1)
        if null > 2:
            os.close(null)
    become_subreaper()
    status: int | None = None
    while status is None:
        info = signal.sigwaitinfo(WAITED)
        if info.si_signo == signal.SIGCHLD:
            status = _reap(watcher)
        elif not in_step:
            with contextlib.suppress(ProcessLookupError):
                os.kill(watcher, info.si_signo)  # our unreaped child: the pid is its own
    left = Leftovers()
    for line in _read_all(messages).splitlines():
        with contextlib.suppress(ValueError, TypeError, KeyError):
            left.take(json.loads(line))
    killed, removed = 0, ""
    try:  # nothing may keep us from exiting as the watcher did
        killed = end_descendants()
        removed = _remove_cgroup(left)
        at_end(status)
    except Exception as exc:  # said; then the watcher's status all the same
        _say(f"gpulaunch: the keeper could not clean up after the watcher: {exc}")
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        parts = [f"{killed} process(es) of its ranks"] if killed else []
        if removed:
            parts.append(removed)
        if parts:
            _say(
                f"gpulaunch: the watcher (pid {watcher}) was killed by {_name(sig)}; "
                f"its keeper ended {' and '.join(parts)}"
            )
        _die_by(sig)
    os._exit(os.waitstatus_to_exitcode(status))


def _reap(watcher: int) -> int | None:  # pragma: no cover - keeper
    """Reap every child that ended; the watcher's wait status if it was one."""
    found = None
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return found
        if pid == 0:
            return found
        if pid == watcher:
            found = status


def end_descendants() -> int:
    """SIGKILL every process below us until none is left (we are a subreaper: an orphan
    comes back to us, so once we have no child, nothing of ours is left); how many."""
    killed: set[int] = set()
    me = os.getpid()
    while True:
        live = [p for p in descendants([me], (), ()) if not p.zombie]
        signal_all(live, signal.SIGKILL)
        killed.update(p.pid for p in live)
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            return len(killed)


def _remove_cgroup(left: Leftovers) -> str:  # pragma: no cover - keeper
    """Empty and remove the job's cgroup, if the watcher made it and left it; what was removed."""
    if left.job_cgroup is None or left.own_cgroup is None:
        return ""
    job = Cgroup(left.job_cgroup)
    if not job.path.is_dir():
        return ""
    own = Cgroup(left.own_cgroup)
    for child in _children(job):
        if os.getpid() not in child.pids():
            child.kill()
    for where, controller in left.enabled:
        Cgroup(where).disable(controller)
    with contextlib.suppress(OSError):
        own.add(os.getpid())  # out of the job's watcher cgroup, so that it can go
    remove_tree(job)
    return f"its cgroup {job.path}" if not job.path.exists() else ""


def _children(cgroup: Cgroup) -> list[Cgroup]:
    try:
        return [Cgroup(p) for p in cgroup.path.iterdir() if p.is_dir()]
    except OSError:
        return []


def remove_tree(job: Cgroup) -> bool:
    """Kill what is in a job's cgroups, wait (bounded) for it to go, remove them all."""
    children = _children(job)
    for child in children:
        if child.populated() and os.getpid() not in child.pids():  # never ourselves
            child.kill()
    for controller in _subtree(job):
        job.disable(controller)
    remove_when_empty(children, CLEANUP_TIMEOUT)
    return job.remove()


def _subtree(cgroup: Cgroup) -> set[str]:
    try:
        return cgroup.enabled()
    except OSError:
        return set()


def _read_all(fd: int) -> str:  # pragma: no cover - keeper
    os.set_blocking(fd, False)
    data = b""
    with contextlib.suppress(OSError):
        while chunk := os.read(fd, 65536):
            data += chunk
    os.close(fd)
    return data.decode(errors="replace")


def _name(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


def _say(line: str) -> None:  # pragma: no cover - keeper
    with contextlib.suppress(OSError):
        os.write(2, line.encode(errors="replace") + b"\n")


def _die_by(sig: int) -> NoReturn:  # pragma: no cover - keeper
    """End with the watcher's signal (128+N where a pid namespace's init cannot); never
    with a core file of our own (the watcher's SIGSEGV is not ours)."""
    with contextlib.suppress(OSError, ValueError):
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    with contextlib.suppress(OSError, ValueError):  # SIGKILL and SIGSTOP have no handler
        signal.signal(sig, signal.SIG_DFL)
    with contextlib.suppress(OSError, ValueError):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [sig])
        os.kill(os.getpid(), sig)
    os._exit(128 + sig)
