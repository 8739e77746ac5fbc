"""`srun gpulaunch start` under a real Slurm: two nodes, each a box (tests/integration/slurm.py).

Inside a Slurm step gpulaunch supervises the ranks itself (the direct supervisor), so they
stay in the step's cgroup, where Slurm's limits, accounting and scancel apply. Here
Slurm tracks the step by parentage (proctrack/linuxproc) and makes no cgroup itself: the
step's cgroup is the one its slurmstepd runs in. The tests print what they measure.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.jobs import GPULAUNCH, RANK_SCRIPT, REPO, SHARED, STATE_OF_P, wait_until
from tests.integration.slurm import UID, Cluster, slurm_cluster

pytestmark = pytest.mark.integration

NODES = 2
# scancel's SIGTERM → every rank on every node gone. The issue asks for 2 s; the bound is
# generous for a loaded 2-CPU machine (the test prints what it measured), and well below
# KillWait (30 s), after which Slurm would SIGKILL the step itself.
SCANCEL_BOUND = 15.0
DOCS = REPO / "docs" / "multinode.md"
TRAIN = '''\
"""train.py of docs/multinode.md's sbatch script: records what its rank got."""
import json, os, sys
with open("/proc/self/cgroup") as f:
    cgroup = f.read().splitlines()[-1]
keys = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR",
        "CUDA_VISIBLE_DEVICES", "SLURM_JOB_ID", "SLURM_STEP_ID")
record = {k: os.environ.get(k) for k in keys}
record.update(argv=sys.argv[1:], cgroup=cgroup, host=os.uname().nodename)
with open(f"rank{os.environ['RANK']}.json", "w") as f:
    json.dump(record, f)
'''


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    with slurm_cluster(NODES) as c:
        print(f"\nslurm: {NODES} nodes idle {c.boot_seconds:.2f} s after the boxes began to boot")
        yield c


@pytest.fixture
def jobdir(request: pytest.FixtureRequest) -> Path:
    """A directory every node and the ordinary user can write (the repo is bound in every box)."""
    d = SHARED / f"slurm-{request.node.name[:30]}-{uuid.uuid4().hex[:6]}"
    d.mkdir(parents=True)
    os.chmod(d, 0o777)
    return d


def step_cgroup(cluster: Cluster, user: bool) -> str:
    """The cgroup of a step's slurmstepd (its task's parent): where the step's processes are."""
    res = cluster.run(["srun", "-N1", "sh", "-c", "tail -n1 /proc/$PPID/cgroup"], user=user)
    assert res.returncode == 0, res.stderr
    line = res.stdout.strip()
    assert line.startswith("0::/"), line
    return line


def rank_cgroups(stdout: str) -> dict[int, str]:
    """`rank N cgroup C` lines of rank.py --print (after the live output's `[N] `)."""
    lines = re.finditer(r"^(?:\[\d+\] )?rank (\d+) cgroup (\S+)$", stdout, re.M)
    return {int(m[1]): m[2] for m in lines}


def assert_in_step(cgroups: dict[int, str], step: str) -> None:
    for rank, cgroup in cgroups.items():
        inside = cgroup == step or cgroup.startswith(step + "/")
        assert inside, f"rank {rank}: {cgroup} not in {step}"
        assert "gpulaunch.slice" not in cgroup


def job_id_of(cluster: Cluster, name: str) -> str:
    """The id of the (only) job named `name`, finished or not."""
    out = cluster.run(["scontrol", "--oneliner", "show", "job"], check=True).stdout
    ids = [m[1] for m in re.finditer(rf"JobId=(\d+) JobName={re.escape(name)}\s", out)]
    assert len(ids) == 1, f"jobs named {name}: {ids}"
    return ids[0]


def live(cluster: Cluster, node: int, pids: list[int]) -> list[int]:
    """Which of pids (of node's PID namespace) still exist: a zombie (state Z, never reaped)
    is left behind too."""
    if not pids:
        return []
    out = cluster.sh(f"for p in {' '.join(map(str, pids))}; do {STATE_OF_P}; done; true", node)
    return [int(line.split()[0]) for line in out.splitlines() if line.strip()]


def ready(srun: subprocess.Popen[str], jobdir: Path) -> None:
    """Wait until the 4 ranks are ready; fail at once, with srun's output, if srun ended."""
    wait_until(
        lambda: srun.poll() is not None or len(list(jobdir.glob("rank*.ready"))) == 4,
        120,
        "4 ranks ready",
    )
    if srun.poll() is not None:
        out, err = srun.communicate()
        raise AssertionError(f"srun exited {srun.returncode} before 4 ranks were ready: {err}")


def leftovers(cluster: Cluster, jobdir: Path) -> list[str]:
    """What a job left on any node: a process naming its directory, a job's cgroup."""
    found = []
    for node in range(NODES):
        found += [f"node {node}: {p}" for p in cluster.processes(node, str(jobdir))]
        cgroups = cluster.sh("find /sys/fs/cgroup -type d -name 'gpulaunch-*'", node).split()
        found += [f"node {node}: cgroup {c}" for c in cgroups]
    return found


@pytest.mark.parametrize("user", [False, True], ids=["root", "user"])
def test_srun_keeps_the_ranks_in_the_step(cluster: Cluster, jobdir: Path, user: bool) -> None:
    step = step_cgroup(cluster, user)
    argv = [GPULAUNCH, "start", "--nproc", "2", RANK_SCRIPT, "--dir", str(jobdir), "--print"]
    start = time.monotonic()
    res = cluster.run(["srun", "-N1", *argv], user=user)
    took = time.monotonic() - start
    who = f"uid {UID}" if user else "root"
    print(f"\nsrun gpulaunch start, 2 ranks, as {who}: {took:.2f} s")
    assert res.returncode == 0, res.stderr
    assert "direct supervisor" in res.stderr, res.stderr
    cgroups = rank_cgroups(res.stdout)
    assert sorted(cgroups) == [0, 1], res.stdout
    print(f"step's cgroup {step}; ranks' {sorted(set(cgroups.values()))}")
    assert_in_step(cgroups, step)
    assert leftovers(cluster, jobdir) == []


def docs_sbatch_script() -> str:
    """The sbatch script of docs/multinode.md, as the page shows it."""
    blocks = re.findall(r"```bash\n(.*?)```", DOCS.read_text(), re.S)
    scripts = [b for b in blocks if "#SBATCH" in b]
    assert len(scripts) == 1, f"{len(scripts)} sbatch scripts in {DOCS}"
    return scripts[0]


def test_the_docs_sbatch_script_on_two_nodes(cluster: Cluster, jobdir: Path) -> None:
    script = docs_sbatch_script()
    assert "srun gpulaunch start --nproc-per-node gpu train.py" in script
    (jobdir / "train.sbatch").write_text(script)
    (jobdir / "train.py").write_text(TRAIN)
    # The script as it is; the command line only sizes it to this cluster (2 nodes of 2
    # GPUs each: sbatch's options override the script's #SBATCH lines).
    sbatch = ["sbatch", "--wait", "--nodes", str(NODES), "--gpus-per-node", "2", "train.sbatch"]
    start = time.monotonic()
    res = cluster.run(sbatch, cwd=str(jobdir), timeout=180)
    took = time.monotonic() - start
    job_id = res.stdout.split()[-1] if res.stdout.split() else "?"
    output = "".join(p.read_text() for p in jobdir.glob("slurm-*.out"))
    assert res.returncode == 0, f"{res.stderr}\n{output}"
    runtime = cluster.job_field(job_id, "RunTime")
    # sbatch --wait learns of the end by polling (10 s here); RunTime is Slurm's own measure.
    what = f"docs/multinode.md's sbatch script, {NODES} nodes x 2 ranks"
    print(f"\n{what}: RunTime {runtime}, sbatch --wait {took:.2f} s")
    assert cluster.job_field(job_id, "ExitCode") == "0:0"
    ranks: dict[int, dict[str, Any]] = {}
    for rank in range(4):
        ranks[rank] = json.loads((jobdir / f"rank{rank}.json").read_text())
    hosts = [ranks[r]["host"] for r in range(4)]
    assert hosts == [cluster.hosts[0]] * 2 + [cluster.hosts[1]] * 2, hosts
    for rank, got in ranks.items():
        assert got["WORLD_SIZE"] == "4" and got["LOCAL_WORLD_SIZE"] == "2", got
        assert got["GROUP_RANK"] == str(rank // 2) and got["LOCAL_RANK"] == str(rank % 2), got
        assert got["MASTER_ADDR"] is not None and got["SLURM_JOB_ID"] == job_id, got
        # The step's GPUs, as Slurm gave them (torchrun's way: LOCAL_RANK picks one).
        assert got["CUDA_VISIBLE_DEVICES"] == "0,1", got
        assert got["argv"] == ["--epochs", "10"], got
    assert "direct supervisor" in output, output
    assert f"nodes: 0 {cluster.hosts[0]} ranks 0-1, 1 {cluster.hosts[1]} ranks 2-3" in output
    # Each rank in its node's step (slurmd.service's cgroup here), none in gpulaunch.slice.
    assert all(g["cgroup"].startswith("0::/system.slice/slurmd.service") for g in ranks.values())
    assert leftovers(cluster, jobdir) == []


def test_a_failing_rank_is_the_steps_exit_code(cluster: Cluster, jobdir: Path) -> None:
    name = f"fail-{uuid.uuid4().hex[:6]}"
    argv = [
        *("srun", "-N", str(NODES), "--ntasks-per-node", "1", "-J", name),
        *(GPULAUNCH, "start", "--nproc", "2", RANK_SCRIPT, "--dir", str(jobdir)),
        *("--exit", "3:7", "--sleep", "300"),
    ]
    res = cluster.run(argv)
    assert res.returncode == 7, res.stderr
    assert re.search(r"rank 3 exit 7", res.stderr), res.stderr
    exit_code = cluster.job_field(job_id_of(cluster, name), "ExitCode")
    print(f"\nrank 3 (node 1) exits 7: srun exited {res.returncode}, scontrol ExitCode={exit_code}")
    assert exit_code == "7:0"
    assert leftovers(cluster, jobdir) == []


def test_scancel_stops_every_rank_on_every_node(cluster: Cluster, jobdir: Path) -> None:
    name = f"cancel-{uuid.uuid4().hex[:6]}"
    argv = [
        *("srun", "-N", str(NODES), "--ntasks-per-node", "1", "-J", name),
        *(GPULAUNCH, "start", "--nproc", "2", RANK_SCRIPT, "--dir", str(jobdir), "--sleep", "300"),
    ]
    srun = cluster.popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        ready(srun, jobdir)
        pids = {r: int((jobdir / f"rank{r}.pid").read_text()) for r in range(4)}
        per_node = {node: [pids[r] for r in range(4) if r // 2 == node] for node in range(NODES)}
        assert all(live(cluster, n, p) == p for n, p in per_node.items())
        job_id = job_id_of(cluster, name)
        start = time.monotonic()
        cluster.run(["scancel", job_id], check=True)
        wait_until(
            lambda: not any(live(cluster, n, p) for n, p in per_node.items()),
            60,
            "every rank gone after scancel",
        )
        gone = time.monotonic() - start  # scancel itself included
        _, err = srun.communicate(timeout=60)
        ended = time.monotonic() - start
    finally:
        if srun.poll() is None:
            srun.kill()
            srun.wait()
    print(f"\nscancel → all 4 ranks on {NODES} nodes gone: {gone:.2f} s; srun exited {ended:.2f} s")
    assert gone < SCANCEL_BOUND
    wait_until(
        lambda: cluster.job_field(job_id, "JobState") == "CANCELLED", 60, "the job CANCELLED"
    )
    assert leftovers(cluster, jobdir) == []


def test_slurms_usr1_is_a_notice_not_a_stop(cluster: Cluster, jobdir: Path) -> None:
    """`#SBATCH --signal=USR1@90`'s warning, sent now: every rank gets it and the job goes on.

    (`scancel --signal` signals every process of the step, as the time-limit warning does:
    the ranks may get it from Slurm and from the watcher; one is enough here.)"""
    name = f"usr1-{uuid.uuid4().hex[:6]}"
    argv = [
        *("srun", "-N", str(NODES), "--ntasks-per-node", "1", "-J", name),
        *(GPULAUNCH, "start", "--nproc", "2", RANK_SCRIPT, "--dir", str(jobdir)),
        *("--until-usr1", "1"),  # each rank exits 0 once it got SIGUSR1 (its checkpoint)
    ]
    srun = cluster.popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        ready(srun, jobdir)
        job_id = job_id_of(cluster, name)
        start = time.monotonic()
        cluster.run(["scancel", "--signal=USR1", job_id], check=True)
        _, err = srun.communicate(timeout=60)
        took = time.monotonic() - start
    finally:
        if srun.poll() is None:
            srun.kill()
            srun.wait()
    print(f"\nscancel --signal=USR1 → ranks notified, srun exited {srun.returncode}: {took:.2f} s")
    assert srun.returncode == 0, err
    assert sorted(p.name for p in jobdir.glob("rank*.usr1")) == [f"rank{r}.usr1" for r in range(4)]
    assert cluster.job_field(job_id, "ExitCode") == "0:0"
    assert leftovers(cluster, jobdir) == []


def test_two_tasks_per_node_is_refused_in_one_line(cluster: Cluster, jobdir: Path) -> None:
    argv = [
        *("srun", "-N1", "--ntasks-per-node", "2"),
        *(GPULAUNCH, "start", "--nproc", "1", RANK_SCRIPT, "--dir", str(jobdir)),
    ]
    res = cluster.run(argv)
    ours = [line for line in res.stderr.splitlines() if not line.startswith("srun: ")]
    print(f"\nsrun --ntasks-per-node 2: exit {res.returncode}; {ours[0] if ours else res.stderr}")
    assert res.returncode == 2, res.stderr
    # One line from each of the two tasks, the same line.
    assert len(ours) == 2 and len(set(ours)) == 1, res.stderr
    assert ours[0].startswith("gpulaunch: error: srun started 2 tasks on 1 node;"), ours[0]
    assert "--ntasks-per-node=1" in ours[0]
    assert list(jobdir.iterdir()) == []
