"""The launchers under test, and one started run of any of them.

All run the same rank script on the same machine with the same arguments:

    gpulaunch start --supervisor systemd --nproc N --job TOKEN SCRIPT ARGS...   (systemd)
    gpulaunch start --supervisor direct --nproc N --job TOKEN SCRIPT ARGS...    (direct)
    systemd-run --scope --slice=user-UID.slice --unit=session-TOKEN \
        setpriv --reuid UID --regid GID --init-groups \
        gpulaunch start --supervisor systemd --nproc N ...                       (frontend)
    torchrun --standalone --local-addr 127.0.0.1 --nproc-per-node N SCRIPT ARGS...

`frontend` is an ordinary user (bench/frontend.py makes one, lingering) whose
command runs where sshd with pam_systemd puts a login shell, a `session-*.scope`
in root's `user-UID.slice`: their user manager cannot adopt it, so gpulaunch runs
its front end there and the watcher as a service of the user manager. `setpriv`
rather than `runuser`: it execs, so the process we start and time is the front end
itself (systemd-run --scope execs too), not a PAM parent that waits for it.

`--local-addr 127.0.0.1` because torchrun otherwise hands the ranks the machine's
hostname as MASTER_ADDR, and the box's hostname (its own UTS namespace) does not
resolve: the ranks would retry for minutes. gpulaunch uses 127.0.0.1 by default.

A multi-node job is one launcher per node, all on this machine, joined by the static
rendezvous that node 0 serves on loopback (`node_command`):

    gpulaunch start --job TOKEN_nR --rdzv-id TOKEN --nnodes N --node-rank R --nproc P
        --master-addr 127.0.0.1 --master-port PORT --local-addr 127.0.0.1 --grace 10 ...
    torchrun --nnodes N --node-rank R --nproc-per-node P
        --master-addr 127.0.0.1 --master-port PORT --local-addr 127.0.0.1 ...

Each gpulaunch node gets a job id of its own only because all of them share one
systemd here; `--rdzv-id` makes them one job. Here too the hostname does not resolve,
so each node names its address (`--local-addr`).
"""

from __future__ import annotations

import enum
import os
import select
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from bench import frontend, procs

BIN = Path(sys.executable).parent
RANKS = Path(__file__).resolve().parent / "ranks"
LOOPBACK = "127.0.0.1"
NODE_GRACE_S = 10  # gpulaunch's default, spelled out: how long a stopped rank gets after SIGTERM


class Launcher(enum.StrEnum):
    """A launcher under test: gpulaunch in three ways, and torchrun to compare with."""

    SYSTEMD = "systemd"  # gpulaunch --supervisor systemd, as root: the system manager
    DIRECT = "direct"  # gpulaunch --supervisor direct: the watcher supervises the ranks
    FRONTEND = "frontend"  # an ordinary user from a login session: the front end (issue 14)
    TORCHRUN = "torchrun"

    @property
    def label(self) -> str:
        """How the report names it."""
        return "torchrun" if self is Launcher.TORCHRUN else f"gpulaunch {self.value}"

    @property
    def ours(self) -> bool:
        return self is not Launcher.TORCHRUN

    @property
    def supervisor(self) -> str:
        """gpulaunch's --supervisor for this launcher."""
        return "direct" if self is Launcher.DIRECT else "systemd"


LAUNCHERS = tuple(Launcher)  # every launcher, in the report's column order
OURS = tuple(launcher for launcher in LAUNCHERS if launcher.ours)
TWO = (Launcher.SYSTEMD, Launcher.TORCHRUN)  # what scenario 7 (several nodes) compares


def order(rep: int, among: Sequence[Launcher] = LAUNCHERS) -> tuple[Launcher, ...]:
    """Interleave: each repetition runs each, rotating which goes first."""
    among = tuple(among)
    if not among:
        return ()
    at = rep % len(among)
    return among[at:] + among[:at]


def new_token(label: str) -> str:
    """A token unique to one run: also the gpulaunch job id (no character needs escaping)."""
    return f"bench_{label}_{uuid.uuid4().hex[:10]}"


def rank_script(name: str) -> str:
    return str(RANKS / f"{name}.py")


def command(
    launcher: Launcher,
    nproc: int,
    script: str,
    args: Sequence[str],
    token: str,
    tee: bool = False,
) -> list[str]:
    """The launcher's command line; the token is the job id and the ranks' --token.

    `tee`: torchrun with `--tee 3` (every rank's stdout and stderr to the console
    with rank prefixes and to log files), what gpulaunch's live view does anyway.
    """
    script_args = [*args, "--token", token]
    if launcher.ours:
        return [
            *(frontend.prefix(token) if launcher is Launcher.FRONTEND else []),
            str(BIN / "gpulaunch"),
            "start",
            "--supervisor",
            launcher.supervisor,
            "--nproc",
            str(nproc),
            "--job",
            token,
            script,
            *script_args,
        ]
    return [
        str(BIN / "torchrun"),
        "--standalone",
        "--local-addr",
        "127.0.0.1",
        "--nproc-per-node",
        str(nproc),
        *(["--tee", "3"] if tee else []),
        script,
        *script_args,
    ]


@dataclass(frozen=True)
class Node:
    """One node of a multi-node job whose nodes all run on this machine."""

    rank: int  # --node-rank
    nnodes: int
    port: int  # node 0's rendezvous store, the same for every node
    rdzv_id: str  # the job among the nodes, the same for every node

    @property
    def token(self) -> str:
        """This node's token and gpulaunch job id: TOKEN_nR (no character needs escaping)."""
        return f"{self.rdzv_id}_n{self.rank}"


def node_command(
    launcher: Launcher, node: Node, nproc: int, script: str, args: Sequence[str]
) -> list[str]:
    """The command line of one node's launcher (static rendezvous, no restarts)."""
    script_args = [*args, "--token", node.token]
    rendezvous = [
        "--nnodes",
        str(node.nnodes),
        "--node-rank",
        str(node.rank),
        "--master-addr",
        LOOPBACK,
        "--master-port",
        str(node.port),
        "--local-addr",
        LOOPBACK,
    ]
    if launcher.ours:
        return [
            str(BIN / "gpulaunch"),
            "start",
            "--supervisor",
            launcher.supervisor,
            "--job",
            node.token,
            "--rdzv-id",
            node.rdzv_id,
            *rendezvous,
            "--nproc",
            str(nproc),
            "--grace",
            str(NODE_GRACE_S),
            script,
            *script_args,
        ]
    return [
        str(BIN / "torchrun"),
        *rendezvous,
        "--nproc-per-node",
        str(nproc),
        script,
        *script_args,
    ]


def free_port() -> int:
    """A TCP port free on loopback right now, for node 0's rendezvous store."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOOPBACK, 0))
        port: int = s.getsockname()[1]
        return port


def environment(
    token: str, extra: Mapping[str, str] | None = None, launcher: Launcher | None = None
) -> dict[str, str]:
    env = dict(os.environ)
    env.update(extra or {})
    env[procs.TOKEN_VAR] = token
    env.pop("OMP_NUM_THREADS", None)  # both launchers set 1 unless it is set
    if launcher is Launcher.FRONTEND:
        env.update(frontend.login_environment())
        env.pop("DBUS_SESSION_BUS_ADDRESS", None)
    return env


@dataclass
class Run:
    """One launcher process we started; `pid` is the launcher itself (torchrun: its agent)."""

    launcher: Launcher
    token: str
    argv: list[str]
    proc: subprocess.Popen[bytes]
    started_at: float  # time.time() just before the fork
    pidfd: int
    exited_at: float | None = None
    chunks: list[tuple[float, bytes]] = field(default_factory=list)  # stdout, when captured
    # CPU of the launcher and every descendant it reaped (its ranks, its helpers): wait4(2).
    tree_cpu_s: float | None = None

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def returncode(self) -> int | None:
        return self.proc.returncode

    def wait_exit(self, timeout: float) -> bool:
        """Wait up to `timeout` s for the launcher to exit; records when it did."""
        if self.exited_at is not None:
            return True
        if self.proc.stdout is not None:
            return self._pump(time.monotonic() + timeout, until_eof=False)
        ready, _, _ = select.select([self.pidfd], [], [], max(timeout, 0))
        if ready:
            self._exited()
        return self.exited_at is not None

    def drain(self, timeout: float) -> bool:
        """Read the captured stdout to EOF and wait for the exit; False on timeout."""
        return self._pump(time.monotonic() + timeout, until_eof=True)

    def _pump(self, deadline: float, until_eof: bool) -> bool:
        out = self.proc.stdout
        assert out is not None
        fd = out.fileno()
        while True:
            watched = [self.pidfd] if self.exited_at is None else []
            if not out.closed:
                watched.append(fd)
            if not watched or (not until_eof and self.exited_at is not None):
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            ready, _, _ = select.select(watched, [], [], left)
            if fd in ready:
                data = os.read(fd, 1 << 20)
                if data:
                    self.chunks.append((time.time(), data))
                else:
                    out.close()
            if self.pidfd in ready:
                self._exited()

    def _exited(self) -> None:
        self.exited_at = time.time()
        _, status, rusage = os.wait4(self.pid, 0)
        self.proc.returncode = os.waitstatus_to_exitcode(status)  # Popen will not wait again
        self.tree_cpu_s = rusage.ru_utime + rusage.ru_stime
        os.close(self.pidfd)
        self.pidfd = -1

    def signal(self, signum: int) -> None:
        if self.exited_at is None:
            os.kill(self.pid, signum)

    def close(self, cap: float = 10.0) -> list[str]:
        """Kill whatever of this run is left; returns what had to be cleaned up (or nothing)."""
        leftovers = []
        if self.exited_at is None and self.proc.poll() is None:
            leftovers.append("launcher still running")
            self.proc.kill()
        self.proc.wait()
        if self.pidfd >= 0:
            os.close(self.pidfd)
            self.pidfd = -1
        if self.proc.stdout is not None and not self.proc.stdout.closed:
            self.proc.stdout.close()
        killed = procs.kill_token(self.token, cap)
        if killed:
            leftovers.append(f"{killed} job processes killed")
        if self.launcher.ours:
            units = job_units(self.token, self.launcher)
            if units:
                leftovers.append(f"units left: {' '.join(units)}")
                stop_job(self.token, self.launcher)
        return leftovers


def start(
    launcher: Launcher,
    nproc: int,
    script: str,
    args: Sequence[str],
    label: str,
    log_dir: Path,
    capture: bool = False,
    extra_env: Mapping[str, str] | None = None,
    tee: bool = False,
) -> Run:
    """Start a launcher; its stdout is captured (read with `drain`) or written to a file."""
    token = new_token(label)
    argv = command(launcher, nproc, script, args, token, tee)
    return _spawn(launcher, token, argv, log_dir, capture, extra_env)


def start_node(
    launcher: Launcher,
    node: Node,
    nproc: int,
    script: str,
    args: Sequence[str],
    log_dir: Path,
    extra_env: Mapping[str, str] | None = None,
) -> Run:
    """Start one node's launcher of a multi-node job; its stdout is written to a file."""
    argv = node_command(launcher, node, nproc, script, args)
    return _spawn(launcher, node.token, argv, log_dir, False, extra_env)


def spawn(
    launcher: Launcher,
    token: str,
    argv: list[str],
    log_dir: Path,
    capture: bool,
    extra_env: Mapping[str, str] | None,
) -> Run:
    """Start `argv` as a run of `launcher` (the soak wraps gpulaunch's command line)."""
    return _spawn(launcher, token, argv, log_dir, capture, extra_env)


def _spawn(
    launcher: Launcher,
    token: str,
    argv: list[str],
    log_dir: Path,
    capture: bool,
    extra_env: Mapping[str, str] | None,
) -> Run:
    stderr = open(log_dir / f"{token}.{launcher}.err", "wb")  # noqa: SIM115 - closed below
    stdout: int | IO[bytes] = (
        subprocess.PIPE if capture else open(log_dir / f"{token}.{launcher}.out", "wb")  # noqa: SIM115
    )
    try:
        started_at = time.time()
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=stdout,
            stderr=stderr,
            env=environment(token, extra_env, launcher),
        )
    finally:
        stderr.close()
        if not isinstance(stdout, int):
            stdout.close()
    return Run(launcher, token, argv, proc, started_at, os.pidfd_open(proc.pid))


def stderr_text(run: Run, log_dir: Path) -> str:
    """What the launcher wrote to its stderr ("" when there is no file)."""
    try:
        return (log_dir / f"{run.token}.{run.launcher}.err").read_text(errors="replace")
    except OSError:
        return ""


def stderr_tail(run: Run, log_dir: Path, lines: int = 8) -> str:
    return "\n".join(stderr_text(run, log_dir).splitlines()[-lines:])


def _systemctl(launcher: Launcher) -> list[str]:
    """systemctl for the manager that runs the job: root's, or the front end user's."""
    if launcher is Launcher.FRONTEND:
        return ["systemctl", "--user", "--machine", f"{frontend.USER}@"]
    return ["systemctl"]


def job_units(token: str, launcher: Launcher = Launcher.SYSTEMD) -> list[str]:
    """The gpulaunch job's units that systemd still knows, in any state (none: direct)."""
    if launcher is Launcher.DIRECT:
        return []
    out = subprocess.run(
        [*_systemctl(launcher), "list-units", "--all", "--plain", "--no-legend"]
        + [f"gpulaunch-{token}*"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def stop_job(token: str, launcher: Launcher = Launcher.SYSTEMD) -> None:
    for unit in (f"gpulaunch-{token}-launch.service", f"gpulaunch-{token}.slice"):
        subprocess.run([*_systemctl(launcher), "stop", unit], capture_output=True, check=False)


def wait_units_gone(token: str, cap: float, launcher: Launcher = Launcher.SYSTEMD) -> float | None:
    """Seconds until systemd no longer lists any unit of the job; None after `cap`."""
    start = time.monotonic()
    while job_units(token, launcher):
        if time.monotonic() - start > cap:
            return None
        time.sleep(0.05)
    return time.monotonic() - start
