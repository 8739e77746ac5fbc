"""The progress channel with real ranks in the box (issue 26 items 1-3, 5): steps in
`status`, `top`, `--json`, on the bus and in the record; stragglers flagged live; a job
that prints but never steps is hung; Lightning's callback."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from typing import Any

import pytest

from gpulaunch.progress.journal import STRAGGLER_MESSAGE_ID
from tests.integration.container import container
from tests.integration.jobs import GPULAUNCH, REPO, SHARED, Job, assert_clean, wait_until
from tests.integration.shared import (
    CGROUP_LINE,
    PGROUP_LINE,
    Subscriber,
    finish,
    gl,
    gpulaunch,
    make_user,
    prop,
    start_running,
)

pytestmark = pytest.mark.integration

SCRIPTS = REPO / "tests" / "integration" / "scripts"
STEPPER = str(SCRIPTS / "stepper.py")
STEPPER_ARGS = [STEPPER]


def wait_done(job: Job, ranks: range, timeout: float = 180) -> None:
    for rank in ranks:
        job.wait_file(f"rank{rank}.done", timeout)


def straggler_entries(job: Job) -> list[dict[str, Any]]:
    out = job.box.run(
        [
            "journalctl",
            "-o",
            "json",
            "--all",
            f"MESSAGE_ID={STRAGGLER_MESSAGE_ID}",
            f"GPULAUNCH_JOB={job.id}",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [json.loads(line) for line in out.splitlines()]


def live(job: Job) -> dict[int, dict[str, Any]]:
    """`status --json`'s ranks."""
    res = gl(job, "status", job.id, "--json", timeout=60)
    assert res.returncode == 0, res.stderr
    return {r["rank"]: r for r in json.loads(res.stdout)["ranks"]}


def stepped(job: Job) -> set[int | None]:
    """The steps `status --json` shows (None: a rank that reported none yet)."""
    return {(r["steps"] or {}).get("step") for r in live(job).values()}


def recorded_steps(job: Job) -> dict[int, dict[str, Any]]:
    ranks = json.loads(job.record()["GPULAUNCH_RANKS"])
    return {r["rank"]: r["steps"] for r in ranks}


def test_a_slow_rank_is_flagged_live_and_the_others_never(job: Job) -> None:
    """4 ranks, rank 2 sleeps 200 ms more per step: flagged within 20 of its steps, in the
    terminal, the journal (its own MESSAGE_ID), the bus, status --json, top, the record."""
    bus = Subscriber(job)
    proc = job.popen("--nproc", "4", script=STEPPER, script_args=["--slow-rank", "2"])
    try:
        wait_done(job, range(4))
        # the bus's view is at most NOTIFY_EVERY (1 s) behind the ranks
        wait_until(lambda: stepped(job) == {30}, 30, "every rank's step 30 in status")
        ranks = live(job)
        for rank, r in ranks.items():
            steps = r["steps"]
            assert (steps["step"], steps["total"]) == (30, 30), r
            assert steps["steps_per_second"] > 0 and steps["seconds_since_step"] >= 0, r
            assert steps["straggler"] is (rank == 2) and steps["straggled"] == (rank == 2), r
        assert ranks[2]["steps"]["step_seconds"] > 1.5 * ranks[0]["steps"]["step_seconds"]
        assert prop(job, "Stragglers") == [2]
        top = gl(job, "top", job.id, "--once", timeout=60)
        assert top.returncode == 0, top.stderr
        flagged = [line.split()[0] for line in top.stdout.splitlines() if "STRAGGLER" in line]
        assert flagged == ["2"], top.stdout
        text = gl(job, "status", job.id, timeout=60).stdout
        assert "30/30 STRAGGLER" in text and "done stepping" in text, text
    finally:
        code, err = finish(job, proc)
        events = bus.events()
    assert code == 143, err
    assert "rank 2 is a straggler" in err and "rank 0 is a" not in err, err
    changed = [e["body"][1] for e in events if e["member"] == "PropertiesChanged"]
    assert [c["Stragglers"] for c in changed if "Stragglers" in c] == [[2]], changed
    assert not any("Steps" in c for c in changed), changed  # read on demand only
    entries = straggler_entries(job)
    assert [(e["GPULAUNCH_RANK"], e["GPULAUNCH_STRAGGLER"]) for e in entries] == [("2", "1")]
    assert int(entries[0]["GPULAUNCH_STEP"]) <= 20, entries
    steps = recorded_steps(job)
    assert {r: s["straggled"] for r, s in steps.items()} == {0: 0, 1: 0, 2: 1, 3: 0}
    assert_clean(job)


def test_no_flag_over_1000_balanced_steps(job: Job) -> None:
    res = job.run(
        "--nproc",
        "4",
        script=STEPPER,
        script_args=["--steps", "1000", "--step-seconds", "0.01", "--exit"],
        timeout=300,
    )
    assert res.returncode == 0, res.stderr
    assert "straggler" not in res.stderr, res.stderr
    assert straggler_entries(job) == []
    steps = recorded_steps(job)
    assert all(s["step"] == 1000 and s["straggled"] == 0 for s in steps.values()), steps
    assert_clean(job)


def test_a_rank_that_prints_but_never_steps_is_hung(job: Job) -> None:
    """Rank 1 prints every 0.1 s after its second step, rank 0 waits after its third: output
    and CPU say alive, steps say hung. Found within the timeout + 2 s, rank 1 named as
    behind, its stack in the report."""
    proc = job.popen(
        "--nproc",
        "2",
        "--hang-timeout",
        "3",
        script=STEPPER,
        script_args=["--steps", "3", "--print-rank", "1"],
    )
    assert proc.stdout is not None and proc.stderr is not None
    out: list[str] = []
    err: list[tuple[float, str]] = []  # each line of the terminal's stderr, when it came
    readers = [
        threading.Thread(target=lambda: out.extend(proc.stdout or ()), daemon=True),
        threading.Thread(
            target=lambda: err.extend((time.time(), line) for line in proc.stderr or ()),
            daemon=True,
        ),
    ]
    for reader in readers:
        reader.start()
    try:
        proc.wait(timeout=120)
    except subprocess.TimeoutExpired:  # by output and CPU it is alive: it would run on
        os.kill(job.box.inner_pid(proc), signal.SIGTERM)
        proc.wait(timeout=60)
        raise AssertionError("a job that prints but never steps was not found hung") from None
    for reader in readers:
        reader.join(timeout=30)
    text = "".join(line for _, line in err)
    hung = "job hung (--hang-timeout 3): no rank stepped for"
    found = [t for t, line in err if hung in line]
    assert found, text
    found_at = found[0]
    last_step = max(float((job.dir / f"rank{r}.done").read_text()) for r in range(2))
    assert found_at - last_step <= 3 + 2, (found_at - last_step, text)
    assert found_at - last_step >= 3 - 0.5, (found_at - last_step, text)  # not before it
    assert proc.returncode == 124, text
    assert "(rank 1 at step 2, behind the others' 3)" in text, text  # the rank named
    assert "hung (--hang-timeout, status 124): no rank stepped for" in text, text  # headline
    assert "no output and no CPU use" not in text, text  # it printed and computed (issue 35)
    assert any("is busy but takes no step" in line for line in out)  # it did print
    assert "the ranks' stacks" in text and "stall_forever (stepper.py:" in text, text
    assert_clean(job)


def test_a_lightning_trainer_with_the_callback_shows_its_steps_in_status(job: Job) -> None:
    proc = job.popen(
        "--nproc",
        "2",
        script=str(SCRIPTS / "lightning_progress.py"),
        script_args=["--steps", "20", "--checkpoint-every", "5"],
    )
    try:
        for rank in (0, 1):
            job.wait_file(f"fitted{rank}", timeout=240)
        wait_until(lambda: stepped(job) == {20}, 30, "every rank's step 20 in status")
        res = gl(job, "status", job.id, timeout=60)
        assert res.returncode == 0, res.stderr
        rows = [line.split() for line in res.stdout.splitlines()]
        header = next(r for r in rows if r[:1] == ["rank"])
        assert header[-5:] == ["step", "steps/s", "last", "step", "eta"], res.stdout
        done = [r for r in rows if "20/20" in r]
        assert sorted(r[0] for r in done) == ["0", "1"], res.stdout
        assert "rank 0: epoch " in res.stdout and "rank 1: epoch " in res.stdout, res.stdout
        # the callback said each checkpoint Lightning saved (goodput, issue 39)
        out = gl(job, "status", job.id, "--json", timeout=60)
        assert json.loads(out.stdout)["goodput"]["checkpoints"] is True, out.stdout
    finally:
        code, err = finish(job, proc)
    assert code == 143, err[-3000:]
    assert_clean(job)


def test_a_straggler_that_catches_up_is_cleared(job: Job) -> None:
    """Rank 1 is slow for its first 20 steps, then keeps up: flagged, then cleared after
    --straggler-steps steps at the others' pace (the journal, the bus, the record)."""
    res = job.run(
        "--nproc",
        "3",
        script=STEPPER,
        script_args=["--steps", "50", "--slow-rank", "1", "--slow-steps", "20", "--exit"],
        timeout=300,
    )
    assert res.returncode == 0, res.stderr
    assert "rank 1 is a straggler" in res.stderr and "rank 1 keeps up again" in res.stderr
    entries = straggler_entries(job)
    flags = [(e["GPULAUNCH_RANK"], e["GPULAUNCH_STRAGGLER"]) for e in entries]
    assert flags == [("1", "1"), ("1", "0")], entries
    assert int(entries[1]["GPULAUNCH_STEP"]) <= 20 + 10 + 2, entries  # 10 steps at pace
    steps = recorded_steps(job)
    assert steps[1]["straggler"] is False and steps[1]["straggled"] == 1, steps
    ended = gl(job, "status", job.id, timeout=60).stdout
    assert "steps: rank 0 50/50, rank 1 50/50 (a straggler 1x), rank 2 50/50" in ended, ended
    assert_clean(job)


def test_ranks_that_never_report_look_as_before(job: Job) -> None:
    proc = start_running(job, 2)
    try:
        text = gl(job, "status", job.id, timeout=60).stdout
        assert "steps/s" not in text and "rank 0:" not in text, text
        assert all(r["steps"] is None and r["status_text"] is None for r in live(job).values())
        assert prop(job, "Steps") == [] and prop(job, "Stragglers") == []
    finally:
        code, err = finish(job, proc)
    assert code == 143, err
    assert all(s is None for s in recorded_steps(job).values())
    assert_clean(job)


@pytest.mark.parametrize("read_only", [False, True], ids=["cgroup", "pgroup"])
def test_the_direct_supervisor_knows_a_rank_s_child_by_its_ancestry(read_only: bool) -> None:
    """No systemd (a container): a rank's child steps; its cgroup (or, with no cgroup of
    its own, its ancestry) names its rank. status reads the record file."""
    work = SHARED / f"progress-{uuid.uuid4().hex[:8]}"
    (work / "state").mkdir(parents=True)
    with container(read_only=read_only) as ct:
        job = "stepdirect"
        argv = [*STEPPER_ARGS, "--dir", str(work), "--steps", "5", "--exit", "--in-child"]
        script = (
            gpulaunch(work, "start", "--nproc", "2", "--job", job, *argv)
            + " && "
            + gpulaunch(work, "status", "--json", job)
        )
        res = ct.run(script)
        assert res.returncode == 0, res.stdout
        assert (PGROUP_LINE if read_only else CGROUP_LINE) in res.stdout, res.stdout
        record = json.loads(res.stdout[res.stdout.index("{\n") :])
        assert [r["steps"]["step"] for r in record["ranks"]] == [5, 5], res.stdout


def test_an_ordinary_user_s_ranks_report_their_steps(box: Any, job: Job) -> None:
    """From a login shell: the user manager's scopes, the front end's watcher."""
    login = make_user(box, "glsteps", manager=True)
    os.chmod(job.dir, 0o777)
    res = login.run(
        job.argv(
            "--nproc", "2", script=STEPPER, script_args=["--steps", "5", "--exit", "--in-child"]
        )
    )
    assert res.returncode == 0, res.stderr
    status = login.run([GPULAUNCH, "status", "--json", job.id])
    assert status.returncode == 0, status.stderr
    ranks = json.loads(status.stdout)["ranks"]
    assert [r["steps"]["step"] for r in ranks] == [5, 5], status.stdout


FLOOD = """
import errno, json, socket, sys, time
address = sys.argv[1]
target = b"\\0" + address[1:].encode() if address.startswith("@") else address
sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
sent, refused, errors = 0, 0, set()
deadline = time.monotonic() + float(sys.argv[2])
while time.monotonic() < deadline:
    try:
        sock.sendto(b"X_GPULAUNCH_STEP=999999", socket.MSG_DONTWAIT, target)
        sent += 1
    except BlockingIOError:
        refused += 1  # the queue is full: the flood is reaching it
    except OSError as exc:
        errors.add(errno.errorcode.get(exc.errno, str(exc.errno)))
print(json.dumps({"sent": sent, "full": refused, "errors": sorted(errors)}))
"""


def test_another_users_flood_cannot_reach_the_socket_nor_refuse_a_step(job: Job) -> None:
    """Issue 35: the channel's abstract name was reachable by any user (listed in
    /proc/net/unix): a flood kept its queue full, and 22-45 % of the ranks' steps were
    refused. The socket is a file in a 0700 directory of the job's user now: another
    user's flood (given the address, as /proc/net/unix would tell it) sends nothing, and
    every step of every rank arrives."""
    steps = 600
    proc = job.popen(
        "--nproc",
        "2",
        script=STEPPER,
        script_args=["--steps", str(steps), "--step-seconds", "0.005"],
    )
    try:
        job.wait_file("rank0.pid")
        rank0 = (job.dir / "rank0.pid").read_text()
        environ = job.box.run(
            ["sh", "-c", f"tr '\\0' '\\n' < /proc/{rank0}/environ"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        address = dict(v.split("=", 1) for v in environ.splitlines() if "=" in v)["NOTIFY_SOCKET"]
        flood = job.box.run(
            ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
            + [sys.executable, "-I", "-c", FLOOD, address, "4"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert flood.returncode == 0, flood.stderr
        got = json.loads(flood.stdout)
        assert got["sent"] == 0 and got["full"] == 0 and got["errors"] == ["EACCES"], got
        wait_done(job, range(2))
        assert [(job.dir / f"rank{r}.refused").read_text() for r in range(2)] == ["0", "0"]
        assert stepped(job) == {steps}
    finally:
        code, err = finish(job, proc)
    assert code == 143, err
    assert_clean(job)
