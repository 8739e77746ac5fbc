"""A real Slurm for the tests: Debian's slurmctld, slurmd and munge, one node per systemd box.

Each node is an sdbox (its own systemd, hostname and PID namespace) on the host's
loopback, node N at 127.0.0.N+1 (as in test_multinode.py); box 0 runs slurmctld as
well as its slurmd, and every box has the same slurm.conf, munge key and /etc/hosts
(every node's name). The recipe (docs/multinode.md, "Verified with a real Slurm"):

- `ProctrackType=proctrack/linuxproc`, `TaskPlugin=task/none`: Slurm tracks a step's
  processes by their parentage and makes no cgroup of its own, so "the step's cgroup"
  is the one its slurmstepd runs in (slurmd.service's, in the box).
- slurmd refuses a hybrid cgroup layout ("Hybrid mode is not supported"): it reads
  /proc/self/cgroup, which lists the host's v1 hierarchies even inside the box. On such
  a host the box mounts the v1 controllers privately under /run/slurmcg and cgroup.conf
  points Slurm there. On a pure cgroup2 host Slurm picks its cgroup/v2 plugin itself.
- Every node has CPUs=64 and two GPUs (`Gres=gpu:2`) that exist only for Slurm and
  gpulaunch: /dev/nvidia0-1 are copies of /dev/null's device number, and the driver's
  /proc/driver/nvidia/gpus lists them (a tmpfs over /proc/driver), so that the sbatch
  script of docs/multinode.md (`--gpus-per-node`, `--nproc-per-node gpu`) runs as it is.
- `SlurmdParameters=config_overrides`: the nodes claim what slurm.conf says.

The cluster is up once `sinfo` says every node is idle; if it is not within
BOOT_TIMEOUT, `SlurmError` says why (with slurmctld's and slurmd's last log lines):
the tests error, they never skip.
"""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sdbox import Box
from tests.integration.conftest import box_files
from tests.integration.jobs import GPULAUNCH, REPO

BOOT_TIMEOUT = 90.0
USER = "slurmuser"
UID = 4242
GPUS = 2
BIN = str(Path(GPULAUNCH).parent)  # the venv's bin: gpulaunch on srun's PATH
PATH = f"{BIN}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class SlurmError(Exception):
    """The cluster did not come up: one line saying why."""


def host_is_hybrid() -> bool:
    """The host lists cgroup v1 hierarchies (slurmd would see them in the box)."""
    lines = Path("/proc/self/cgroup").read_text().splitlines()
    return any(not line.startswith("0::") for line in lines)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def slurm_conf(hosts: Sequence[str], ctld_port: int, slurmd_ports: Sequence[int]) -> str:
    nodes = [
        f"NodeName={h} NodeAddr=127.0.0.{i + 1} Port={p} CPUs=64 Gres=gpu:{GPUS} State=UNKNOWN"
        for i, (h, p) in enumerate(zip(hosts, slurmd_ports, strict=True))
    ]
    return "\n".join(
        [
            "ClusterName=box",
            f"SlurmctldHost={hosts[0]}(127.0.0.1)",
            "AuthType=auth/munge",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "SelectType=select/cons_tres",
            "GresTypes=gpu",
            "SlurmdParameters=config_overrides",
            f"SlurmctldPort={ctld_port}",
            "StateSaveLocation=/var/spool/slurmctld",
            "SlurmdSpoolDir=/var/spool/slurmd",
            "SlurmUser=slurm",
            "ReturnToService=2",
            "MpiDefault=none",
            "KillWait=30",  # scancel: SIGTERM, then SIGKILL only after 30 s
            "RequeueExit=79",  # gpulaunch's status of a preempted job: requeue it
            # a requeued job waits this long before it runs again (default 120 s)
            "AuthInfo=cred_expire=15",
            *nodes,
            f"PartitionName=main Nodes={','.join(hosts)} Default=YES MaxTime=INFINITE State=UP",
        ]
    )


CGROUP_V1 = "CgroupPlugin=cgroup/v1\nCgroupMountpoint=/run/slurmcg\nCgroupAutomount=no\n"

# Run in each box before its daemons start.
PREPARE = f"""
set -e
if [ "$HYBRID" = 1 ]; then
    mkdir -p /run/slurmcg && mount -t tmpfs none /run/slurmcg
    for c in freezer cpuset memory devices; do
        mkdir -p /run/slurmcg/$c && mount -t cgroup -o $c cgroup /run/slurmcg/$c
    done
fi
for i in $(seq 0 {GPUS - 1}); do mknod -m 666 /dev/nvidia$i c 1 3; done
mount -t tmpfs none /proc/driver
for i in $(seq 0 {GPUS - 1}); do
    d=/proc/driver/nvidia/gpus/0000:0$((i + 1)):00.0
    mkdir -p $d
    printf 'Model: Fake\\nDevice Minor: %s\\nBus Location: %s\\n' $i ${{d##*/}} >$d/information
done
mkdir -p /var/spool/slurmctld /var/spool/slurmd && chown slurm:slurm /var/spool/slurmctld
chown -R munge:munge /etc/munge && chmod 700 /etc/munge && chmod 400 /etc/munge/munge.key
useradd --uid {UID} --create-home {USER}
chmod 711 /root  # the user reaches this Python (pyenv lives under /root); the box's overlay only
"""


@dataclass
class Cluster:
    """The booted nodes; node 0 is also the controller and where commands are submitted."""

    boxes: list[Box]
    hosts: list[str]
    boot_seconds: float

    def command(self, argv: Sequence[str], user: bool = False) -> list[str]:
        """argv with Slurm's clients and gpulaunch on PATH, as root or as the ordinary user.

        The environment is a login's, minimal: no XDG_RUNTIME_DIR, no bus address
        (srun passes on what its caller has, and a Slurm step has no user manager)."""
        env = ["env", "-i", f"PATH={PATH}", "LANG=C.UTF-8"]
        if user:
            who = ["setpriv", f"--reuid={UID}", f"--regid={UID}", "--init-groups"]
            return [*who, *env, f"HOME=/home/{USER}", f"USER={USER}", *argv]
        return [*env, "HOME=/root", "USER=root", *argv]

    def run(
        self, argv: Sequence[str], node: int = 0, user: bool = False, cwd: str | None = None,
        **kw: Any,
    ) -> subprocess.CompletedProcess[str]:  # fmt: skip
        kw.setdefault("capture_output", True)
        kw.setdefault("timeout", 120)
        return self.boxes[node].run(self.command(argv, user), cwd=cwd or str(REPO), **kw)

    def popen(
        self, argv: Sequence[str], node: int = 0, user: bool = False, cwd: str | None = None,
        **kw: Any,
    ) -> subprocess.Popen[str]:  # fmt: skip
        return self.boxes[node].popen(self.command(argv, user), cwd=cwd or str(REPO), **kw)

    def sh(self, script: str, node: int = 0) -> str:
        """A root shell script in a node (no Slurm involved); its stdout. Fails loudly."""
        res = self.boxes[node].run(["sh", "-c", script], cwd="/", capture_output=True)
        if res.returncode != 0:
            raise AssertionError(f"node {node}: {script!r} exited {res.returncode}: {res.stderr}")
        return res.stdout

    def node_states(self) -> dict[str, str]:
        res = self.run(["sinfo", "--noheader", "--Node", "--format=%N %T"], timeout=30)
        return dict(line.split() for line in res.stdout.splitlines() if len(line.split()) == 2)

    def job_field(self, job_id: str, field: str) -> str:
        """A field of `scontrol show job`, e.g. ExitCode or JobState."""
        out = self.run(["scontrol", "show", "job", job_id], check=True).stdout
        for word in out.split():
            key, sep, value = word.partition("=")
            if sep and key == field:
                return value
        raise AssertionError(f"no {field} in scontrol show job {job_id}: {out}")

    def processes(self, node: int, pattern: str) -> list[str]:
        """Processes of a node whose command line contains pattern (pgrep -af)."""
        res = self.boxes[node].run(["pgrep", "-af", pattern], capture_output=True, cwd="/")
        return [line for line in res.stdout.splitlines() if "pgrep" not in line]

    def logs(self) -> str:
        out = []
        for i, box in enumerate(self.boxes):
            units = ["-u", "munge", "-u", "slurmd", *(["-u", "slurmctld"] if i == 0 else [])]
            res = box.run(
                ["journalctl", "--no-pager", "-o", "cat", "-n", "8", *units],
                capture_output=True,
                cwd="/",
            )
            out.append(f"node {i}: " + " | ".join(res.stdout.split("\n")))
        return "; ".join(out)


@contextmanager
def slurm_cluster(nodes: int) -> Iterator[Cluster]:
    """Boot `nodes` boxes and a Slurm across them; SlurmError if it does not come up."""
    start = time.monotonic()
    tag = secrets.token_hex(2)
    names = [f"slurm{os.getpid()}-{tag}n{i}" for i in range(nodes)]
    hosts = [f"sdbox-{name}" for name in names]
    ports = [free_port() for _ in range(nodes + 1)]
    # Every node's name, node 0's before localhost: a reverse lookup of 127.0.0.1 (node 0's
    # FQDN, which gpulaunch reports) gives its name, as on a real node.
    nodes_lines = "".join(f"127.0.0.{i + 1}\t{h}\n" for i, h in enumerate(hosts))
    hosts_file = nodes_lines + "127.0.0.1\tlocalhost\n"
    files = {
        **box_files(),
        "etc/hosts": hosts_file,
        "etc/slurm/slurm.conf": slurm_conf(hosts, ports[0], ports[1:]) + "\n",
        "etc/slurm/cgroup.conf": CGROUP_V1 if host_is_hybrid() else "CgroupPlugin=autodetect\n",
        "etc/slurm/gres.conf": f"Name=gpu File=/dev/nvidia[0-{GPUS - 1}]\n",
        "etc/munge/munge.key": secrets.token_hex(64),
    }
    env = {"HYBRID": "1" if host_is_hybrid() else "0"}
    with ExitStack() as stack:
        boxes = [stack.enter_context(Box(name, binds=[REPO], files=files)) for name in names]
        cluster = Cluster(boxes, hosts, 0.0)
        for i, box in enumerate(boxes):
            res = box.run(
                ["sh", "-c", PREPARE], cwd="/", capture_output=True, env={**os.environ, **env}
            )
            if res.returncode != 0:
                raise SlurmError(f"node {i} could not be prepared for Slurm: {res.stderr.strip()}")
        for i, box in enumerate(boxes):
            daemons = ["munge", *(["slurmctld"] if i == 0 else []), "slurmd"]
            res = box.run(["systemctl", "start", *daemons], cwd="/", capture_output=True)
            if res.returncode != 0:
                raise SlurmError(
                    f"node {i}: systemctl start {' '.join(daemons)} failed: "
                    f"{res.stderr.strip()}; {cluster.logs()}"
                )
        deadline = time.monotonic() + BOOT_TIMEOUT
        while True:
            states = cluster.node_states()
            if sorted(states) == sorted(hosts) and set(states.values()) == {"idle"}:
                break
            failed = [
                f"node {i} {unit}"
                for i, box in enumerate(boxes)
                for unit in ("slurmctld", "slurmd")[0 if i == 0 else 1 :]
                if box.run(["systemctl", "is-failed", "--quiet", unit], cwd="/").returncode == 0
            ]
            if failed:
                raise SlurmError(f"{', '.join(failed)} exited; {cluster.logs()}")
            if time.monotonic() > deadline:
                raise SlurmError(
                    f"Slurm's nodes are not idle after {BOOT_TIMEOUT:.0f} s "
                    f"(sinfo: {states or 'nothing'}); {cluster.logs()}"
                )
            time.sleep(0.2)
        cluster.boot_seconds = time.monotonic() - start
        yield cluster
