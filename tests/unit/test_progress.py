"""gpulaunch/progress/: the rank helper, the datagram's fields, step rates, stragglers, and
the channel on a real socket with the kernel's credentials (no fakes but the rank table)."""

from __future__ import annotations

import asyncio
import errno
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import pytest

from gpulaunch import progress
from gpulaunch.base.procs import HeldChild
from gpulaunch.jobapi.rankview import RankView, from_wire, ranks_json, steps_wire, with_steps
from gpulaunch.jobapi.stepview import step_cells
from gpulaunch.model import RankSpec, StepInfo, StragglerRule
from gpulaunch.plan.spec import StartOptions
from gpulaunch.progress.behind import behind
from gpulaunch.progress.channel import ProgressChannel, sender_of
from gpulaunch.progress.journal import STRAGGLER_MESSAGE_ID, StragglerNote
from gpulaunch.progress.protocol import parse
from gpulaunch.progress.stragglers import Stragglers
from gpulaunch.progress.tracker import Sample, StepTracker
from gpulaunch.watcher.hangwatch import last_step
from gpulaunch.watcher.ranks import Rank
from tests.unit.fakes import make_job

ROOT = Path(__file__).resolve().parents[2]


def test_importing_the_helper_loads_nothing_of_the_launcher() -> None:
    code = "import sys, gpulaunch.progress; print(' '.join(sorted(sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    ).stdout.split()
    ours = sorted(m for m in out if m.startswith("gpulaunch"))
    assert ours == ["gpulaunch", "gpulaunch.progress"], ours


def test_the_helper_is_a_no_op_without_a_socket(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    assert progress.step(1) is False and progress.status("x") is False
    monkeypatch.setenv("NOTIFY_SOCKET", "relative/path")  # not an address sd_notify knows
    assert progress.ready() is False


def test_the_helper_sends_sd_notify_lines(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as server:
        server.bind("")
        name = server.getsockname()
        assert isinstance(name, bytes)
        monkeypatch.setenv("NOTIFY_SOCKET", "@" + name[1:].decode())
        assert progress.step(7, total=100, seconds=0.25)
        assert server.recv(4096) == (
            b"X_GPULAUNCH_STEP=7\nX_GPULAUNCH_TOTAL=100\nX_GPULAUNCH_STEP_SECONDS=0.250000"
        )
        assert progress.status("epoch 2\nof 3")
        assert server.recv(4096) == b"STATUS=epoch 2 of 3"


def test_the_fields_are_read_and_bad_values_say_nothing() -> None:
    n = parse(b"READY=1\nSTATUS=warming up\nX_GPULAUNCH_STEP=12\nX_GPULAUNCH_TOTAL=99\nFOO=bar")
    assert (n.ready, n.status, n.step, n.total, n.watchdog) == (True, "warming up", 12, 99, False)
    assert parse(b"X_GPULAUNCH_STEP=-3").step is None
    assert parse(b"X_GPULAUNCH_STEP=x\nX_GPULAUNCH_TOTAL=5").total is None  # no step, no total
    assert parse(b"X_GPULAUNCH_STEP=1\nX_GPULAUNCH_STEP_SECONDS=nan").step_seconds is None
    assert parse(b"WATCHDOG=1\n\xff\xfe").watchdog
    assert parse(b"STATUS=" + b"y" * 1000).status == "y" * 200


def test_a_tracker_measures_rate_and_step_time() -> None:
    t = StepTracker()
    assert t.report(1, 100, at=10.0) is None  # one mark: no step time yet
    assert t.report(3, None, at=11.0) == Sample(0.5, 2)  # two steps in a second
    assert t.report(3, None, at=11.5) is None  # the same step again (accumulation)
    t.report(5, None, at=12.0)
    info = t.info()
    assert info is not None
    assert (info.step, info.total, info.at) == (5, 100, 12.0)
    assert info.steps_per_second == pytest.approx(2.0)
    assert info.step_seconds == pytest.approx(0.5)
    assert info.eta_seconds() == pytest.approx(47.5)
    assert t.report(1, None, at=13.0) is None  # started over: a new window
    assert t.report(2, None, at=13.1, seconds=0.02) == Sample(0.02, 1)  # its own time wins


def judge_all(rule: StragglerRule, times: dict[int, list[float]]) -> dict[int, list[int]]:
    """Steps in lockstep: each rank's step time from `times`; where each was flagged."""
    judge, trackers = Stragglers(rule), {r: StepTracker() for r in times}
    at = dict.fromkeys(times, 0.0)
    flagged: dict[int, list[int]] = {r: [] for r in times}
    for i in range(len(next(iter(times.values())))):
        for rank, series in times.items():
            at[rank] += series[i]
            sample = trackers[rank].report(i + 1, None, at[rank])
            if sample is None:
                continue
            others = {
                n: s for n, t in trackers.items() if n != rank and (s := t.step_seconds) is not None
            }
            verdict = judge.judge(rank, sample, others)
            if verdict is not None and verdict.straggler:
                flagged[rank].append(i + 1)
    return flagged


def test_no_flag_over_1000_balanced_steps_with_jitter() -> None:
    rng = random.Random(26)
    # 25 % jitter each way, and now and then a pause (a GC, a checkpoint) of 3x a step
    times = {
        r: [0.1 * rng.uniform(0.75, 1.25) * (3 if rng.random() < 0.01 else 1) for _ in range(1000)]
        for r in range(8)
    }
    assert judge_all(StragglerRule(1.5, 10), times) == {r: [] for r in range(8)}


def test_a_slow_rank_is_flagged_within_its_steps_and_the_others_never() -> None:
    rng = random.Random(5)
    times = {r: [0.05 * rng.uniform(0.8, 1.2) for _ in range(100)] for r in range(4)}
    times[2] = [t + 0.2 for t in times[2]]
    flagged = judge_all(StragglerRule(1.5, 10), times)
    assert flagged[0] == flagged[1] == flagged[3] == []
    assert flagged[2] and flagged[2][0] <= 12, flagged  # 10 slow steps after its first sample


def test_a_straggler_is_cleared_when_it_keeps_up_for_as_many_steps() -> None:
    judge = Stragglers(StragglerRule(2.0, 3))
    others = {0: 1.0, 1: 1.0}
    verdicts = [judge.judge(2, Sample(s, 1), others) for s in (3, 3, 3, 1, 3, 1, 1, 1)]
    changes = [(i, v.straggler) for i, v in enumerate(verdicts) if v is not None]
    assert changes == [(2, True), (7, False)]  # the slow step at 4 starts the count again
    assert judge.times == {2: 1} and judge.flagged == set()
    assert judge.judge(2, Sample(9, 5), {}) is None  # alone: never a straggler


def test_the_straggler_entry_has_its_own_message_id() -> None:
    note = StragglerNote("j", 2, "u.scope", True, 0.3, 0.1, 14, StragglerRule())
    fields = dict(note.fields())
    assert fields["MESSAGE_ID"] == STRAGGLER_MESSAGE_ID != "74b8d59289c14f16ad639b2abe1d2863"
    assert fields["GPULAUNCH_RANK"] == "2" and fields["GPULAUNCH_STRAGGLER"] == "1"
    assert "rank 2 is a straggler: 0.3 s a step, 3.0x the other ranks' 0.1 s" in note.message()


@dataclass
class FakeRank:
    spec: RankSpec
    child: HeldChild | None = None
    cgroup: Path | None = None
    steps: StepInfo | None = None
    status_text: str | None = None


def rank_of(number: int, pid: int) -> FakeRank:
    spec = RankSpec(rank=number, local_rank=number, unit=f"r{number}.scope", argv=(), env={})
    return FakeRank(spec=spec, child=HeldChild(pid=pid, pidfd=-1, gate=None))


def test_the_sender_is_known_by_its_pid_never_by_what_it_says() -> None:
    me = rank_of(0, os.getpid())
    other = rank_of(1, 1)  # pid 1: never an ancestor of ours that counts
    assert sender_of(os.getpid(), [other, me]) is me
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert sender_of(child.pid, [other, me]) is me  # a descendant of its main process
        assert sender_of(child.pid, [other]) is None
    finally:
        child.kill()
        child.wait()


def test_the_channel_reads_datagrams_with_the_kernel_s_pid(monkeypatch: pytest.MonkeyPatch) -> None:
    spec, _ = make_job([["true"], ["true"]])
    ranks = [rank_of(0, os.getpid()), rank_of(1, 1)]
    said: list[str] = []
    changed: list[int] = []
    loop = asyncio.new_event_loop()
    channel = ProgressChannel(spec, lambda: ranks, said.append, journal=False)
    with ExitStack() as stack:
        stack.callback(loop.close)
        channel.attach(stack, loop, lambda fd, h: loop.add_reader(fd, h), lambda: changed.append(1))
        monkeypatch.setenv("NOTIFY_SOCKET", channel.environment()["NOTIFY_SOCKET"])
        progress.step(1, total=10)
        progress.status("epoch 0")
        progress.step(2, total=10)
        # a datagram claiming to be rank 1 is rank 0's all the same: the kernel says who
        progress.notify("RANK=1\nX_GPULAUNCH_STEP=3")
        channel._on_readable()
        assert ranks[1].steps is None
        assert ranks[0].steps is not None and ranks[0].steps.step == 3
        assert ranks[0].steps.total == 10 and ranks[0].status_text == "epoch 0"
        loop.run_until_complete(asyncio.sleep(1.2))  # the observers' coalesced update
        assert changed == [1]
    assert channel.sock.fileno() == -1  # closed with the stack


def test_steps_travel_on_the_bus_and_in_json() -> None:
    info = StepInfo(step=5, total=10, at=100.0, steps_per_second=2.0, step_seconds=0.5)
    view = RankView(0, 0, "u", 1, "running", -1, 0, False, -1, 0.0, steps=info, status_text="hi")
    wire = steps_wire(view)
    assert wire is not None and from_wire(wire) == (0, info, "hi")
    bare = RankView(0, 0, "u", 1, "running", -1, 0, False, -1, 0.0)
    assert with_steps([bare], [wire]) == (view,)
    out = ranks_json(view)
    assert out["steps"]["step"] == 5 and out["steps"]["eta_seconds"] == pytest.approx(2.5)
    assert out["status_text"] == "hi"
    assert RankView.from_json(out).steps == info
    assert step_cells(info, now=103.0) == ("5/10", "2", "3.00s ago", "2.50s")


def test_a_hang_by_steps_counts_only_this_attempt_s_steps() -> None:
    spec = RankSpec(rank=0, local_rank=0, unit="u", argv=(), env={})
    a, b = Rank(spec=spec), Rank(spec=RankSpec(1, 1, "v", (), {}))
    assert last_step([a, b], since=0.0) is None
    a.steps = StepInfo(step=4, total=None, at=10.0, steps_per_second=None, step_seconds=None)
    b.steps = StepInfo(step=3, total=None, at=12.0, steps_per_second=None, step_seconds=None)
    found = last_step([a, b], since=5.0)
    assert found is not None and found[0] == 1 and found[1].step == 3
    assert last_step([a, b], since=20.0) is None  # a restart began after them


def test_straggler_options_reach_the_spec() -> None:
    assert StartOptions.__dataclass_fields__["stragglers"].default == StragglerRule(1.5, 10)


@pytest.fixture
def reachable() -> Iterator[Path]:
    """A runtime base every user may search (pytest's tmp_path is root's 0700): what keeps
    another user out is then the socket's own directory, nothing above it."""
    top = Path(tempfile.mkdtemp(prefix="gl-progress-", dir="/tmp"))
    top.chmod(0o711)
    try:
        yield top
    finally:
        shutil.rmtree(top)


FLOOD = 20000


def test_another_user_cannot_reach_the_socket_and_refuses_no_step(
    monkeypatch: pytest.MonkeyPatch, reachable: Path
) -> None:
    """Issue 35: the abstract name was reachable by every user (/proc/net/unix lists it): a
    flood kept the queue full, cost the watcher a CPU and refused up to 45 % of the ranks'
    steps. The socket is a file in a 0700 directory of the job's user now: another user's
    flood cannot even reach it, and not one of a rank's steps is refused meanwhile."""
    if os.geteuid() != 0:
        pytest.skip("sending as another user needs root (CI runs the tests as root)")
    spec, _ = make_job([["true"]])
    ranks = [rank_of(0, os.getpid())]  # this process is the rank
    channel = ProgressChannel(spec, lambda: ranks, journal=False, base=reachable)
    address = channel.environment()["NOTIFY_SOCKET"]
    assert address.startswith(str(reachable / "gpulaunch") + "/"), address
    private = Path(address).parent
    assert private.stat().st_uid == 0 and private.stat().st_mode & 0o777 == 0o700
    monkeypatch.setenv("NOTIFY_SOCKET", address)
    r, w = os.pipe()
    go_r, go_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child: as nobody, floods the socket
        code = 1
        try:
            os.close(r)
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            os.close(go_w)
            os.read(go_r, 1)
            sent = sum(progress.step(n) for n in range(FLOOD))  # sd_notify's way, and raw:
            raw = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            try:
                raw.connect(address)
                sent += 1
            except OSError as exc:
                os.write(w, f"{exc.errno} ".encode())
            os.write(w, str(sent).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    os.close(go_r)
    try:
        os.close(go_w)  # the flood begins; the rank reports its steps meanwhile
        refused = 0
        for n in range(1, 501):
            refused += not progress.step(n, total=500)
            if n % 5 == 0:  # the queue holds 10 (net.unix.max_dgram_qlen's default)
                channel._on_readable()
        channel._on_readable()
        with os.fdopen(r) as f:
            told = f.read()
        assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0
        assert told == f"{errno.EACCES} 0", told  # not one datagram reached it
        assert refused == 0 and channel.strangers == 0
        assert ranks[0].steps is not None and ranks[0].steps.step == 500
    finally:
        channel.close()
    assert not private.exists()  # removed with the channel


@pytest.mark.parametrize("example", ["progress_loop.py", "progress_accelerate.py"])
def test_the_examples_are_python_that_compiles(example: str) -> None:
    """accelerate is not a dependency: its example is at least right Python (ruff lints both)."""
    source = (ROOT / "examples" / example).read_text()
    compile(source, example, "exec")
    assert "from gpulaunch.progress import" in source


def test_a_hang_by_steps_names_who_is_behind() -> None:
    assert behind({0: 4, 1: 3, 2: 4}) == "rank 1 at step 3, behind the others' 4"
    assert behind({0: 4, 1: 2, 2: 3, 3: 2}) == (
        "ranks 1, 3 at step 2, rank 2 at step 3, behind the others' 4"
    )
    assert behind({0: 7, 1: 7}) == "every rank at step 7"
    assert behind({0: 7, 1: None, 2: None}) == "rank 0 at step 7; ranks 1, 2 never stepped"
