"""A drop-in for torchrun and Lightning: same environment, same flags, the cause rank's error."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

from tests.integration.jobs import GPULAUNCH, REPO, Job, assert_clean
from tests.integration.shared import SAME_VALUE

pytestmark = pytest.mark.integration

SCRIPTS = REPO / "tests" / "integration" / "scripts"
TORCHRUN = str(Path(sys.executable).with_name("torchrun"))

# Keys both set, with values that differ by nature (ports, run ids, paths, who hosts the store).
SAME_KEY = [
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_ERROR_FILE",
    "TORCHELASTIC_USE_AGENT_STORE",
]


def test_environment_matches_torchrun(job: Job) -> None:
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    theirs, ours = job.dir / "torchrun", job.dir / "gpulaunch"
    theirs.mkdir()
    ours.mkdir()
    script = str(SCRIPTS / "envdump.py")
    res = job.box.run(
        # --local-addr: the box's hostname (its own UTS namespace) resolves to nothing
        [
            TORCHRUN,
            "--standalone",
            "--local-addr",
            "127.0.0.1",
            "--nproc-per-node",
            "3",
            script,
            "--out",
            str(theirs),
        ],
        cwd=str(REPO),
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    res = job.box.run(
        [GPULAUNCH, "start", "--nproc-per-node", "3", "--job", job.id, script, "--out", str(ours)],
        cwd=str(REPO),
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    assert "OMP_NUM_THREADS" in res.stderr  # torchrun's warning when it sets the default
    for rank in range(3):
        t = json.loads((theirs / f"env{rank}.json").read_text())
        g = json.loads((ours / f"env{rank}.json").read_text())
        for key in SAME_VALUE:
            assert g.get(key) == t.get(key), key
        for key in SAME_KEY:
            assert key in t and key in g, key
        assert g["MASTER_ADDR"] == t["MASTER_ADDR"] == "127.0.0.1"
        assert g["TORCHELASTIC_RUN_ID"] == job.id
        # every key torchrun adds to the environment, we add too
        added_by_torchrun = set(t) - set(env)
        assert added_by_torchrun <= set(g), added_by_torchrun - set(g)


def test_module_and_no_python(job: Job) -> None:
    env = dict(os.environ, PYTHONPATH=str(SCRIPTS / "pkg"))
    res = job.box.run(
        [GPULAUNCH, "start", "--nproc", "2", "--job", job.id, "-m", "gl_mod", "a", "--b"],
        cwd=str(REPO),
        capture_output=True,
        text=True,
        env=env,
    )
    assert res.returncode == 0, res.stderr
    assert "[1] module rank 1 argv ['a', '--b']" in res.stdout.splitlines()
    res = job.box.run(
        [
            GPULAUNCH,
            "start",
            "--nproc",
            "2",
            "--job",
            job.id + "-np",
            "--no-python",
            "sh",
            "-c",
            'echo "shell rank $RANK of $WORLD_SIZE"',
        ],
        cwd=str(REPO),
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0, res.stderr
    assert "[0] shell rank 0 of 2" in res.stdout.splitlines()
    res = job.box.run(
        [
            GPULAUNCH,
            "start",
            "--nproc",
            "1",
            "--job",
            job.id + "-rp",
            "--run-path",
            str(SCRIPTS / "envdump.py"),
            "--out",
            str(job.dir),
        ],
        cwd=str(REPO),
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0, res.stderr
    assert (job.dir / "env0.json").exists()


def test_max_restarts(job: Job) -> None:
    res = job.run("--nproc", "2", "--max-restarts", "2", script=str(SCRIPTS / "restart.py"))
    assert res.returncode == 0, res.stderr
    seen = {p.name for p in job.dir.glob("attempt*")}
    # rank 0 of the first attempt may be stopped before it writes its file
    assert {"attempt0-rank1", "attempt1-rank0", "attempt1-rank1"} <= seen
    assert seen <= {"attempt0-rank0", "attempt0-rank1", "attempt1-rank0", "attempt1-rank1"}
    assert (job.dir / "attempt1-rank0").read_text() == "2"  # TORCHELASTIC_MAX_RESTARTS
    assert "restarting all ranks (restart 1 of 2)" in res.stderr
    assert "restarted 1 time (--max-restarts)" in res.stderr


def test_record_traceback_in_the_report(job: Job) -> None:
    res = job.run(
        "--nproc", "3", script=str(SCRIPTS / "recorded.py"), script_args=["--fail-rank", "1"]
    )
    assert res.returncode == 1, res.stderr
    report = res.stderr[res.stderr.index("failed: rank 1") :]
    assert "rank 1's error, from its error file (@record):" in report
    assert "Traceback (most recent call last):" in report
    assert "ValueError: recorded failure in rank 1" in report
    assert "rank 0's error" not in report and "rank 2's error" not in report


def test_stderr_tail_in_the_report_without_record(job: Job) -> None:
    res = job.run(
        "--nproc",
        "2",
        script=str(SCRIPTS / "rank.py"),
        script_args=["--sleep", "60", "--exit", "1:5", "--fail-after", "0.2"],
    )
    assert res.returncode == 5
    # rank.py prints nothing to stderr: the report says nothing rather than inventing an error
    assert "rank 1's error" not in res.stderr


def test_a_huge_stderr_line_is_bounded_in_report_record_and_status(job: Job) -> None:
    # issue 13 item 12: 20 MiB without a newline gave a 1 MB report, record and status
    spew = 20 << 20
    res = job.run(
        "--nproc",
        "2",
        "--quiet",
        script=str(SCRIPTS / "rank.py"),
        script_args=["--sleep", "60", "--exit", "1:5", "--spew", str(spew)],
    )
    assert res.returncode == 5, res.stderr[-2000:]
    # no traceback: the report shows its last lines of stderr (issue 35), bounded all the same
    report = res.stderr[res.stderr.index("rank 1 exited 5 without a traceback") :]
    cut = f"[... {spew - 512} bytes cut ...]"
    assert cut in report and len(report) < 10_000, len(report)
    entry = job.record()
    error = entry["GPULAUNCH_CAUSE_ERROR"]
    assert cut in error and len(error) < 10_000, len(error)
    assert len(entry["MESSAGE"]) < 12_000
    status = job.box.run(
        [GPULAUNCH, "status", job.id], cwd=str(REPO), capture_output=True, text=True
    )
    assert status.returncode == 0, status.stderr
    assert cut in status.stdout and len(status.stdout) < 12_000, len(status.stdout)
    as_json = job.box.run(
        [GPULAUNCH, "status", "--json", job.id], cwd=str(REPO), capture_output=True, text=True
    ).stdout
    assert len(as_json) < 16_000


@pytest.mark.parametrize(
    ("flag", "hint"),
    [
        (["--tee", "3"], "--log-dir"),
        (["--redirects", "3"], "journal"),
        (["--monitor-interval", "1"], "no polling"),
    ],
)
def test_torchrun_only_flags_say_what_to_use(job: Job, flag: list[str], hint: str) -> None:
    res = job.box.run(
        [GPULAUNCH, "start", *flag, "x.py"], cwd=str(REPO), capture_output=True, text=True
    )
    assert res.returncode == 2
    assert res.stderr.count("\n") == 1 and hint in res.stderr and "Traceback" not in res.stderr


def test_nproc_per_node_cpu_and_gpu(job: Job) -> None:
    res = job.run("--nproc-per-node", "cpu", script=str(SCRIPTS / "rank.py"))
    assert res.returncode == 0, res.stderr
    assert len(list(job.dir.glob("rank*.pid"))) == os.cpu_count()
    res = job.box.run(
        [GPULAUNCH, "start", "--nproc-per-node", "gpu", str(SCRIPTS / "rank.py")],
        cwd=str(REPO),
        capture_output=True,
        text=True,
        env=dict(os.environ, CUDA_VISIBLE_DEVICES=""),
    )
    assert res.returncode == 2 and "no GPU" in res.stderr, res.stderr


@pytest.mark.parametrize("kind", ["fabric", "trainer"])
def test_lightning_runs_exactly_n_processes(job: Job, kind: str) -> None:
    script = str(SCRIPTS / f"lightning_{kind}.py")
    res = job.run("--nproc", "3", script=script, script_args=["--devices", "3"], timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    records = [json.loads(p.read_text()) for p in sorted(job.dir.glob(f"{kind}*.json"))]
    assert sorted(r["global_rank"] for r in records) == [0, 1, 2]
    assert all(r["world_size"] == 3 for r in records)
    assert all(r["environment"] == "TorchElasticEnvironment" for r in records)
    # every rank is a child of the watcher: Lightning spawned no processes of its own
    assert len({r["ppid"] for r in records}) == 1
    assert len({r["pid"] for r in records}) == 3


@pytest.mark.parametrize("kind", ["fabric", "trainer"])
def test_lightning_rank_failure_stops_everything(job: Job, kind: str) -> None:
    script = str(SCRIPTS / f"lightning_{kind}.py")
    start = time.monotonic()
    res = job.run(
        "--nproc",
        "3",
        script=script,
        script_args=["--devices", "3", "--fail-rank", "2"],
        timeout=300,
    )
    took = time.monotonic() - start
    assert res.returncode == 1, res.stderr[-3000:]
    assert "failed: rank 2 exit 1" in res.stderr
    report = res.stderr[res.stderr.index("failed: rank 2") :]
    assert f"{kind} rank 2 failed on purpose" in report  # rank 2's own traceback
    assert took < 120  # not the 30-minute collective timeout
    assert_clean(job)
