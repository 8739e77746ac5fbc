"""Forking a rank held at a start gate, releasing it, and reaping it by pidfd.

The gate exists because a rank must not run a single line of user code before
systemd moved it into its scope (`StartTransientUnit` replies before the move,
docs/systemd-facts.md): the child blocks on a pipe until the watcher has seen the
scope's start job finish.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import resource
import signal
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from gpulaunch.base import nofile
from gpulaunch.linux import set_parent_death_signal

# Exit codes of a child that never reached the script.
GATE_CLOSED = 126  # the watcher went away or gave up before opening the gate
EXEC_FAILED = 127  # like a shell: the program could not be executed


@dataclass
class HeldChild:
    """A forked child waiting at its gate; `pidfd` becomes readable when it exits."""

    pid: int
    pidfd: int
    gate: int | None  # write end of the gate pipe; None once opened or abandoned

    def release(self) -> None:
        """Let the child exec its program.

        A child that died at its gate (a stop from outside killed it, or the OOM
        killer) has closed the pipe's read end: EPIPE here is not an error of
        ours, and its death comes through its pidfd like any other rank's.
        """
        if self.gate is not None:
            try:
                os.write(self.gate, b"x")
            except BrokenPipeError:
                pass  # it is dead; its pidfd says how
            finally:
                os.close(self.gate)
                self.gate = None

    def abandon(self) -> None:
        """Close the gate without opening it: the child exits with GATE_CLOSED."""
        if self.gate is not None:
            os.close(self.gate)
            self.gate = None

    def close(self) -> None:
        self.abandon()
        if self.pidfd >= 0:
            os.close(self.pidfd)
            self.pidfd = -1


@dataclass(frozen=True)
class WaitStatus:
    """What waitid(2) said about an exited child."""

    code: int | None
    signal: int | None
    core_dumped: bool

    def describe(self) -> str:
        if self.signal is not None:
            return f"signal {self.signal}"
        return f"exit {self.code}"


# What a held child sets for itself (_child_setup), blocked from the fork until it has.
CHILD_SIGNALS = (
    signal.SIGPIPE,
    signal.SIGXFSZ,
    signal.SIGINT,
    signal.SIGTERM,
    signal.SIGHUP,
    signal.SIGUSR1,
    signal.SIGUSR2,
)


def fork_held(
    body: Callable[[], object],
    fds: Mapping[int, int],
    ignore: Sequence[signal.Signals] = (),
    death_signal: int = 0,
) -> HeldChild:
    """Fork a child that runs `body` once released.

    `fds` maps the child's fd numbers to the parent's fds to put there (e.g.
    {1: a pipe}); every other fd except 0-2 is closed in the child, so that if
    the watcher dies while the child waits, no sibling keeps its gate open and
    it sees EOF and leaves. The child is its own process group: a terminal's
    Ctrl-C reaches the watcher only, which stops the ranks through systemd.
    `ignore`: signals the child ignores from its very start (a gang stop can
    reach it while it still waits at the gate). `death_signal`: what the kernel
    sends the child when the watcher dies (PR_SET_PDEATHSIG; 0: nothing).
    """
    read_end, write_end = os.pipe()
    parent = os.getpid()
    # Until the child has its own dispositions, a stop's SIGTERM must wait: the gate may
    # open, the rank run and fail and the gang stop before a loaded machine runs the
    # child's first line, and it would then die of it (a pump losing its rank's last
    # lines) or run the watcher's handler (a phantom interrupt through the wakeup fd).
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, CHILD_SIGNALS)
    try:
        pid = os.fork()
    finally:
        if os.getpid() == parent:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    if pid == 0:  # pragma: no cover - the child; it never returns
        try:
            try:
                if death_signal:
                    set_parent_death_signal(death_signal)
                    if os.getppid() != parent:  # it died before the line above
                        os._exit(GATE_CLOSED)
                gate = _child_setup(read_end, fds, ignore)
                signal.pthread_sigmask(signal.SIG_SETMASK, mask)  # pending: now as set up
            except OSError as exc:
                # Still the watcher's stderr (fd 2 is replaced last): say why, once.
                with contextlib.suppress(OSError):
                    os.write(2, f"gpulaunch: child {os.getpid()} cannot start: {exc}\n".encode())
                os._exit(EXEC_FAILED)
            if os.read(gate, 1) != b"x":
                os._exit(GATE_CLOSED)
            os.close(gate)
            body()
        finally:
            os._exit(EXEC_FAILED)
    os.close(read_end)
    try:
        pidfd = os.pidfd_open(pid)
    except OSError:
        os.close(write_end)
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        raise
    return HeldChild(pid=pid, pidfd=pidfd, gate=write_end)


def _child_setup(
    gate: int, fds: Mapping[int, int], ignore: Sequence[signal.Signals]
) -> int:  # pragma: no cover - in the child
    """Signals back to defaults, own process group, exactly the wanted fds; returns the gate fd."""
    # Python ignores SIGPIPE and SIGXFSZ, and an ignored signal survives exec;
    # the watcher's handlers must not run here either.
    for sig in CHILD_SIGNALS:
        signal.signal(sig, signal.SIG_IGN if sig in ignore else signal.SIG_DFL)
    signal.set_wakeup_fd(-1)
    os.setpgid(0, 0)
    top = max([2, *fds]) + 1
    wanted = {**fds, top: gate}
    # First close every fd of the watcher we do not pass on: the child has its
    # limit, and the watcher may use nearly all of it (a rank per few fds).
    keep = sorted({0, 1, 2, *wanted.values()})
    for low, high in zip(keep, [*keep[1:], os.sysconf("SC_OPEN_MAX")], strict=True):
        os.closerange(low + 1, high)
    # Then move every source above all targets, so that no dup2 clobbers
    # another source (a target may be some other source's number): F_DUPFD
    # takes the lowest free fd at or above `top + 1`, and with the watcher's
    # fds closed, that is far below any limit.
    moved = {t: fcntl.fcntl(src, fcntl.F_DUPFD_CLOEXEC, top + 1) for t, src in wanted.items()}
    for source in set(wanted.values()) - {0, 1, 2}:
        os.close(source)
    for target, source in moved.items():
        os.dup2(source, target, inheritable=target in fds)
    os.closerange(top + 1, os.sysconf("SC_OPEN_MAX"))
    for fd in range(3, top):
        if fd not in wanted:
            with contextlib.suppress(OSError):
                os.close(fd)
    nofile.restore_user_nofile()  # only now: fds at or above it are gone
    return top


def spawn_held(
    argv: Sequence[str],
    env: Mapping[str, str],
    fds: Mapping[int, int] | None = None,
    death_signal: int = 0,
) -> HeldChild:
    """Fork a child that execs `argv` with `env` once released."""
    env_bytes = {
        k.encode("utf-8", "surrogateescape"): v.encode("utf-8", "surrogateescape")
        for k, v in env.items()
    }
    args = list(argv)

    def execute() -> None:  # pragma: no cover - in the child
        try:
            os.execvpe(args[0], args, env_bytes)
        except OSError as exc:
            os.write(2, f"gpulaunch: cannot execute {args[0]}: {exc.strerror}\n".encode())

    return fork_held(execute, fds or {}, death_signal=death_signal)


def reap(pidfd: int) -> WaitStatus:
    """Collect the exit status of an exited child through its pidfd."""
    result = os.waitid(os.P_PIDFD, pidfd, os.WEXITED)
    assert result is not None
    if result.si_code == os.CLD_EXITED:
        return WaitStatus(code=result.si_status, signal=None, core_dumped=False)
    return WaitStatus(
        code=None, signal=result.si_status, core_dumped=result.si_code == os.CLD_DUMPED
    )


def reap_with_usage(child: HeldChild) -> tuple[WaitStatus, resource.struct_rusage]:
    """Reap a child whose pidfd said it exited, with its rusage (`wait4`; `waitid` has none).

    Only the parent reaps it and it has not been reaped, so its pid is still its own.
    """
    _, status, usage = os.wait4(child.pid, 0)
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        return WaitStatus(code=None, signal=sig, core_dumped=os.WCOREDUMP(status)), usage
    return WaitStatus(code=os.WEXITSTATUS(status), signal=None, core_dumped=False), usage


def kill_held(child: HeldChild) -> None:
    """SIGKILL a child that may still be at its gate (it never ran user code)."""
    try:
        signal.pidfd_send_signal(child.pidfd, signal.SIGKILL)
    except ProcessLookupError:
        pass


def kill_and_reap(children: Sequence[HeldChild | None]) -> None:
    """SIGKILL and reap every child not yet reaped (the watcher's error paths)."""
    for child in children:
        if child is None or child.pidfd < 0:
            continue
        child.abandon()
        try:
            signal.pidfd_send_signal(child.pidfd, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            reap(child.pidfd)
        except ChildProcessError:
            pass
        except OSError as exc:  # pragma: no cover - defensive
            if exc.errno != errno.ECHILD:
                raise
        child.close()
