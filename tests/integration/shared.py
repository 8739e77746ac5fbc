"""What integration tests share beyond jobs.py: the bus and its subscribers, logins of
ordinary users, the direct supervisor's start lines, journald's counts, nodes of a
multi-node job. Test modules import from here (and jobs.py), never from one another.
"""

from __future__ import annotations

import json
import os
import select
import shlex
import signal
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gpulaunch.base.names import UnitNames
from gpulaunch.jobapi.view import bus_name, object_path
from sdbox import Box, HostSystemd, host_systemd_running
from sdbox.box import cgroup2_root
from tests.integration.conftest import box_files
from tests.integration.jobs import (
    GPULAUNCH,
    REPO,
    SHARED,
    Job,
    wait_until,
)

SUBSCRIBER = str(REPO / "tests" / "integration" / "scripts" / "subscriber.py")


def gl(
    job: Job, *argv: str, prefix: Sequence[str] = (), **kw: Any
) -> subprocess.CompletedProcess[str]:
    """`gpulaunch ARGV` in the box."""
    return job.box.run(
        [*prefix, GPULAUNCH, *argv], cwd=str(REPO), capture_output=True, text=True, **kw
    )


def busctl(job: Job, *argv: str) -> str:
    res = job.box.run(["busctl", *argv], capture_output=True, text=True, timeout=30)
    assert res.returncode == 0, res.stderr
    return res.stdout


def prop(job: Job, name: str) -> Any:
    out = busctl(
        job,
        "--json=short",
        "get-property",
        bus_name(job.id),
        object_path(job.id),
        "io.gpulaunch.Job1",
        name,
    )
    return json.loads(out)["data"]


def one_line_error(res: subprocess.CompletedProcess[str], code: int, *needles: str) -> None:
    """The command failed with `code` and one error line, its last (warnings may come first)."""
    assert res.returncode == code, res.stderr
    lines = res.stderr.splitlines()
    assert [line for line in lines if line.startswith("gpulaunch: error: ")] == lines[-1:]
    assert res.stderr.endswith("\n") and "Traceback" not in res.stderr, res.stderr
    for needle in needles:
        assert needle in lines[-1], res.stderr


def start_running(job: Job, nproc: int = 2, *opts: str) -> subprocess.Popen[str]:
    proc = job.popen("--nproc", str(nproc), *opts, script_args=["--sleep", "300"])
    for rank in range(nproc):
        job.wait_file(f"rank{rank}.ready")
    return proc


def finish(job: Job, proc: subprocess.Popen[str]) -> tuple[int, str]:
    if proc.poll() is None:
        try:
            os.kill(job.box.inner_pid(proc), signal.SIGTERM)
        except Exception:  # it is ending by itself
            pass
    _, err = proc.communicate(timeout=60)
    return proc.returncode, err


class Subscriber:
    """A bus client in the box that prints every signal of the job's object."""

    def __init__(self, job: Job) -> None:
        self.proc = job.box.popen(
            [sys.executable, SUBSCRIBER, object_path(job.id)],
            cwd=str(REPO),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], 30)
        assert ready and self.proc.stdout.readline() == "ready\n", self.proc.stderr

    def events(self, timeout: float = 30) -> list[dict[str, Any]]:
        out, err = self.proc.communicate(timeout=timeout)
        assert self.proc.returncode == 0, err
        return [json.loads(line) for line in out.splitlines()]

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()


@pytest.fixture(scope="module")
def box_user(box: object) -> tuple[int, list[str]]:
    """An ordinary user with a running user manager, inside the box only; argv prefix."""
    from sdbox import Box

    if not isinstance(box, Box):
        pytest.skip("needs the throwaway box: it would add a user to this host")
    # Module-scoped, and other modules use it too: the box (one per session) may have it.
    if box.run(["id", "-u", "gljob"], capture_output=True).returncode != 0:
        box.run(["useradd", "--create-home", "gljob"], check=True, capture_output=True)
    box.run(["chmod", "711", "/root"], check=True)  # let the user reach this Python
    uid = int(box.run(["id", "-u", "gljob"], capture_output=True, text=True, check=True).stdout)
    box.run(["systemctl", "start", f"user@{uid}.service"], check=True)
    prefix = [
        "setpriv",
        f"--reuid={uid}",
        f"--regid={uid}",
        "--init-groups",
        "env",
        "HOME=/home/gljob",
        f"XDG_RUNTIME_DIR=/run/user/{uid}",
        f"DBUS_SESSION_BUS_ADDRESS=unix:path=/run/user/{uid}/bus",
    ]
    return uid, prefix


@dataclass(frozen=True)
class Login:
    """An ordinary user of the box, with a running (lingering) user manager."""

    box: Any
    user: str
    uid: int

    def argv(self, argv: Sequence[str], env: Sequence[str] = ()) -> list[str]:
        """argv in a fresh login session of this user (a session-N.scope of root's)."""
        session = f"session-fake{uuid.uuid4().hex[:8]}"
        return [
            "systemd-run", "--quiet", "--scope", f"--slice=user-{self.uid}.slice",
            f"--unit={session}", "runuser", "-u", self.user, "--",
            "env", f"XDG_RUNTIME_DIR=/run/user/{self.uid}", *env,
            # PAM's 1024 open files kill ranks with 127 (fixed elsewhere): raise it, as users do
            "sh", "-c", 'ulimit -Sn "$(ulimit -Hn)"; exec "$@"', "sh", *argv,
        ]  # fmt: skip

    def run(self, argv: Sequence[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        kw.setdefault("timeout", 120)
        return self.box.run(self.argv(argv), cwd=str(REPO), capture_output=True, text=True, **kw)

    def popen(self, argv: Sequence[str]) -> subprocess.Popen[str]:
        return self.box.popen(
            self.argv(argv), cwd=str(REPO), stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )

    def user_units(self) -> str:
        """Every unit of the user manager named gpulaunch-*, in any state."""
        return self.box.run(
            ["runuser", "-u", self.user, "--", "env", f"XDG_RUNTIME_DIR=/run/user/{self.uid}",
             "systemctl", "--user", "list-units", "--all", "--plain", "--no-legend",
             "gpulaunch-*"],
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip

    def frontend_pid(self, job: Job) -> int:
        """The front end's pid in the box (the watcher's command line has --frontend-child)."""
        # Python running the gpulaunch script, not runuser or sh with it in their argv
        pattern = f"^[^ ]*python[^ ]* [^ ]*/gpulaunch start --job {job.id} "
        out = ""

        def found() -> bool:
            nonlocal out
            out = self.box.run(["pgrep", "-f", "--", pattern], capture_output=True).stdout
            return bool(out.split())

        wait_until(found, 30, f"the front end of {job.id}")
        return int(out.split()[0])


def make_user(box: Any, name: str, *, manager: bool) -> Login:
    from sdbox import Box

    if not isinstance(box, Box):
        pytest.skip("needs the throwaway box: it would add a user to this host")
    if box.run(["id", "-u", name], capture_output=True).returncode != 0:  # one box a session
        box.run(["useradd", "--create-home", name], check=True, capture_output=True)
    # Inside the box's overlay only: let the user reach this Python (pyenv lives under /root).
    box.run(["chmod", "711", "/root"], check=True)
    uid = int(box.run(["id", "-u", name], capture_output=True, text=True, check=True).stdout)
    if manager:  # what `loginctl enable-linger` makes logind do at boot
        box.run(["systemctl", "start", f"user@{uid}.service"], check=True)
    return Login(box=box, user=name, uid=uid)


@pytest.fixture(scope="module")
def login(box: Any) -> Login:
    return make_user(box, "glfront", manager=True)


@pytest.fixture
def ujob(job: Job) -> Job:
    os.chmod(job.dir, 0o777)
    return job


def assert_user_clean(login: Login, job: Job) -> None:
    prefix = f"gpulaunch-{job.names.component}"
    wait_until(
        lambda: prefix not in login.user_units(), 10, f"units of {job.id}: {login.user_units()}"
    )
    assert job.alive() == []


def running_from_login(login: Login, job: Job, nproc: int) -> tuple[subprocess.Popen[str], int]:
    proc = login.popen(job.argv("--nproc", str(nproc), script_args=["--sleep", "300", "--print"]))
    for rank in range(nproc):
        job.wait_file(f"rank{rank}.ready")
    return proc, login.frontend_pid(job)


TALK = str(REPO / "tests" / "integration" / "scripts" / "talk.py")


DROP_IN = (REPO / "packaging" / "journald" / "60-gpulaunch.conf").read_text()


def journal_count(job: Job, unit: str) -> int:
    out = job.box.run(
        ["journalctl", "--no-pager", "-q", "-o", "cat", f"_SYSTEMD_UNIT={unit}"],
        capture_output=True,
        check=True,
        text=False,
    ).stdout
    return out.count(b"\n")


# Keys whose values must agree for the same single-node launch.
SAME_VALUE = [
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "ROLE_RANK",
    "ROLE_WORLD_SIZE",
    "ROLE_NAME",
    "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_MAX_RESTARTS",
    "OMP_NUM_THREADS",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING",
    "TORCHELASTIC_SIGNALS_TO_HANDLE",
]


DDP = str(REPO / "tests" / "integration" / "scripts" / "ddp.py")


NNODES = 3


NPROC = 2


@pytest.fixture(scope="module")
def nodes() -> Iterator[list[Box | HostSystemd]]:
    if host_systemd_running():
        yield [HostSystemd()] * NNODES
        return
    with ExitStack() as stack:
        yield [stack.enter_context(Box(binds=[REPO], files=box_files())) for _ in range(NNODES)]


def host(node: int) -> str:
    """Each node its own loopback address, as each machine has its own (127/8 is loopback)."""
    return f"127.0.0.{node + 1}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class Ended:
    node: int
    returncode: int
    stdout: str
    stderr: str


@dataclass
class MultiJob:
    """One job across the nodes: its id, the rank files' directory, its store's port."""

    boxes: list[Box | HostSystemd]
    id: str
    dir: Path
    port: int

    @property
    def shared_systemd(self) -> bool:
        return isinstance(self.boxes[0], HostSystemd)

    def job_id(self, node: int) -> str:
        return f"{self.id}-n{node}" if self.shared_systemd else self.id

    def argv(
        self, node: int, opts: Sequence[str], script_args: Sequence[str], named: bool = True
    ) -> list[str]:
        """`named`: give the job id (else gpulaunch derives it, the same on every node)."""
        if self.shared_systemd:
            names = ["--job", self.job_id(node), "--rdzv-id", self.id]
        else:
            names = ["--job", self.id] if named else []
        return [
            GPULAUNCH,
            "start",
            *names,
            *("--nproc", str(NPROC), "--local-addr", host(node), "--grace", "5"),
            *opts,
            DDP,
            "--dir",
            str(self.dir),
            *script_args,
        ]

    def static(self, node: int, nnodes: int = NNODES) -> list[str]:
        return [
            *("--nnodes", str(nnodes), "--node-rank", str(node)),
            *("--master-addr", "127.0.0.1", "--master-port", str(self.port)),
        ]

    def start(
        self,
        opts: Sequence[Sequence[str]],
        script_args: Sequence[str] = (),
        env: Sequence[dict[str, str]] | None = None,
        named: bool = True,
    ) -> list[subprocess.Popen[str]]:
        """Node i runs with opts[i] (and env[i] added to the environment)."""
        return [
            self.boxes[i].popen(
                self.argv(i, node_opts, script_args, named),
                cwd=str(REPO),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env={**os.environ, **(env[i] if env else {})},
            )
            for i, node_opts in enumerate(opts)
        ]

    def stamp(self, rank: int, name: str) -> float | None:
        path = self.dir / f"rank{rank}.{name}"
        return float(path.read_text()) if path.exists() and path.read_text() else None

    def env(self, rank: int) -> dict[str, str]:
        data: dict[str, str] = json.loads((self.dir / f"rank{rank}.env").read_text())
        return data

    def wait_stamps(self, ranks: Sequence[int], name: str, timeout: float = 120) -> None:
        wait_until(
            lambda: all(self.stamp(r, name) is not None for r in ranks),
            timeout,
            f"{name} stamps of ranks {list(ranks)}",
        )

    def leftovers(self, node: int) -> list[str]:
        """The job's units that systemd on `node` still knows, and its processes there."""
        box = self.boxes[node]
        component = UnitNames.for_job(self.job_id(node)).component
        units = box.run(
            ["systemctl", "list-units", "--all", "--plain", "--no-legend", "gpulaunch-*"],
            capture_output=True,
            check=True,
        ).stdout
        left = [u for u in units.splitlines() if f"gpulaunch-{component}" in u]
        procs = box.run(
            ["pgrep", "-af", f"{DDP}|gpulaunch.multinode.peer"], capture_output=True
        ).stdout
        return left + [p for p in procs.splitlines() if str(self.dir) in p or "peer" in p]

    def stop_all(self) -> None:
        for node, box in enumerate(self.boxes):
            slice_ = UnitNames.for_job(self.job_id(node)).job_slice
            box.run(["systemctl", "stop", slice_], capture_output=True)


@pytest.fixture
def mjob(nodes: list[Box | HostSystemd], request: pytest.FixtureRequest) -> Iterator[MultiJob]:
    label = request.node.name.split("[")[0].removeprefix("test_")[:20].replace("_", "")
    job_id = f"{label}{uuid.uuid4().hex[:6]}"
    d = SHARED / job_id
    d.mkdir(parents=True)
    j = MultiJob(boxes=nodes, id=job_id, dir=d, port=free_port())
    yield j
    j.stop_all()


def finish_nodes(
    procs: Sequence[subprocess.Popen[str]], boxes: Sequence[Box | HostSystemd], timeout: float = 120
) -> list[Ended]:
    ended = []
    for i, proc in enumerate(procs):
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for p, box in zip(procs, boxes, strict=False):
                if p.poll() is None:  # the watcher in the box, not (only) nsenter
                    os.kill(box.inner_pid(p), signal.SIGKILL)
                p.kill()
            raise
        ended.append(Ended(i, proc.returncode, out, err))
    return ended


def node_ranks(node: int) -> list[int]:
    return list(range(node * NPROC, (node + 1) * NPROC))


CGROUP_LINE = "direct supervisor (cgroup /sys/fs/cgroup/gpulaunch-"


PGROUP_LINE = "direct supervisor (process groups; no cgroup:"


def gpulaunch(work: Path, *args: str) -> str:
    return f"env XDG_STATE_HOME={work}/state " + shlex.join([GPULAUNCH, *args])


def slice_dir(job: Job) -> Path:
    """The job slice's cgroup as the host sees it (it exists once systemd created the slice)."""
    root = getattr(job.box, "cgroup", None) or cgroup2_root()
    return Path(root) / "gpulaunch.slice" / job.names.job_slice


def record(job: Job) -> dict[str, Any]:
    """The job's journal record, as `gpulaunch status --json` reads it after the end."""
    res = gl(job, "status", "--json", job.id)
    assert res.returncode == 0, res.stderr
    view: dict[str, Any] = json.loads(res.stdout)
    return view
