"""The direct supervisor where Docker or Kubernetes would run gpulaunch: a container
(tests/integration/container.py) with a writable cgroup2 subtree and no systemd.

gpulaunch runs as the container's PID 1 and as a child of a shell; with the
container's cgroup2 writable (the cgroup path) and read-only as Docker mounts it
by default (no writable cgroup: process groups). An ordinary user is not used:
this machine's Python lives under /root, which nobody else may enter. The
checks that look at processes after the job run inside the container, in the
shell that started it (pids are the container's).
"""

from __future__ import annotations

import os
import random
import shlex
import signal
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpulaunch.jobapi import filerecord
from gpulaunch.jobapi.rankview import RankView
from gpulaunch.jobapi.view import JobState, JobView
from sdbox.procs import first_child
from tests.integration.container import Container, alive_script, container
from tests.integration.jobs import GPULAUNCH, RANK_SCRIPT, SHARED, wait_until
from tests.integration.shared import CGROUP_LINE, PGROUP_LINE, gpulaunch

pytestmark = pytest.mark.integration

# (gpulaunch is the container's PID 1, the container's cgroup2 is read-only)
MODES = {
    "pid1-cgroup": (True, False),
    "shell-cgroup": (False, False),
    "pid1-pgroup": (True, True),
    "shell-pgroup": (False, True),
}


@pytest.fixture
def ct(request: pytest.FixtureRequest) -> Iterator[Container]:
    mode = request.node.callspec.params.get("mode", "") if hasattr(request.node, "callspec") else ""
    with container(read_only=mode.endswith("pgroup")) as c:
        yield c


@pytest.fixture
def work() -> Path:
    d = SHARED / f"direct-{uuid.uuid4().hex[:8]}"
    d.mkdir(parents=True)
    d.chmod(0o777)  # the ordinary user's ranks write their pid files here
    (d / "state").mkdir(mode=0o777)
    (d / "state").chmod(0o777)
    return d


def start(work: Path, ro: bool, job: str, *rank_args: str, opts: tuple[str, ...] = ()) -> str:
    return gpulaunch(
        work, "start", "--nproc", "2", "--job", job, "--grace", "5", *opts,
        RANK_SCRIPT, "--dir", str(work), *rank_args,
    )  # fmt: skip


def ready(work: Path) -> str:
    return f"while [ ! -e {work}/rank0.ready ] || [ ! -e {work}/rank1.ready ]; do sleep 0.05; done"


def checked(work: Path, body: str) -> str:
    """sh: `body` (sets rc), then the processes still alive, then exit rc."""
    return f"{body}; echo rc=$rc; {alive_script(work)}; exit $rc"


def expect_line(out: str, ro: bool) -> None:
    assert (PGROUP_LINE if ro else CGROUP_LINE) in out, out


@pytest.mark.parametrize("mode", MODES)
def test_success_leaves_nothing(mode: str, ct: Container, work: Path) -> None:
    pid1, ro = MODES[mode]
    cmd = start(work, ro, "ok", "--daemon", "--grandchild")
    res = ct.run(f"exec {cmd}" if pid1 else checked(work, f"{cmd}; rc=$?"))
    assert res.returncode == 0, res.stdout
    expect_line(res.stdout, ro)
    assert "ALIVE" not in res.stdout  # daemonised grandchildren too
    assert {"rank0-daemon", "rank1-daemon"} <= {p.stem for p in work.glob("*.pid")}
    assert ct.leftovers() == []


@pytest.mark.parametrize("mode", MODES)
def test_failing_rank_stops_the_gang(mode: str, ct: Container, work: Path) -> None:
    pid1, ro = MODES[mode]
    cmd = start(work, ro, "fail", "--exit", "1:3", "--sleep", "300", "--daemon")
    res = ct.run(f"exec {cmd}" if pid1 else checked(work, f"{cmd}; rc=$?"))
    assert res.returncode == 3, res.stdout
    assert "rank 1 exited 3" in res.stdout or "rank 1 exit" in res.stdout, res.stdout
    assert "ALIVE" not in res.stdout
    assert ct.leftovers() == []


@pytest.mark.parametrize("mode", MODES)
def test_sigterm_stops_every_rank(mode: str, ct: Container, work: Path) -> None:
    pid1, ro = MODES[mode]
    cmd = start(work, ro, "term", "--sleep", "300", "--daemon")
    if pid1:
        proc = ct.popen(f"exec {cmd}", stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        watcher = first_child(proc.pid, lambda: proc.poll() is None)
        wait_until(lambda: all((work / f"rank{r}.ready").exists() for r in (0, 1)), 60, "ranks")
        os.kill(watcher, signal.SIGTERM)
        out, _ = proc.communicate(timeout=120)
        rc = proc.returncode
    else:
        res = ct.run(checked(work, f"{cmd} & w=$!; {ready(work)}; kill -TERM $w; wait $w; rc=$?"))
        out, rc = res.stdout, res.returncode
    assert rc == 128 + signal.SIGTERM, out
    assert "ALIVE" not in out
    assert ct.leftovers() == []


@pytest.mark.parametrize("mode", ["shell-cgroup", "shell-pgroup"])
def test_watcher_sigkill_kills_the_ranks(mode: str, ct: Container, work: Path) -> None:
    """SIGKILL of the pid the shell knows (the keeper): the watcher gets SIGTERM
    (PR_SET_PDEATHSIG) and stops every rank and what it started."""
    _, ro = MODES[mode]
    cmd = start(work, ro, "kill", "--sleep", "300", "--grandchild")
    names = ("rank0", "rank1", "rank0-child", "rank1-child")
    gone = " && ".join(f"[ ! -e /proc/$(cat {work}/{n}.pid) ]" for n in names)
    res = ct.run(
        f"{cmd} & w=$!; {ready(work)}; kill -KILL $w; wait $w; "
        f"i=0; until {gone} || [ $i -gt 600 ]; do sleep 0.05; i=$((i+1)); done; "
        f"{gone} && echo RANKS-GONE"
    )
    assert "RANKS-GONE" in res.stdout, res.stdout


# Every process a job of rank.py can leave: its ranks and what they start.
LEFT = (
    "for d in /proc/[0-9]*; do c=$(tr '\\0' ' ' <$d/cmdline 2>/dev/null); "
    'case "$c" in "sh "*) ;; *rank.py*|*"sleep 300"*|*gpulaunch*) echo "LEFT ${d#/proc/} $c";; '
    "esac; done"
)  # (not the test's own shell, whose script names them all)


def kill_watcher_after(delay: float) -> str:
    """sh, after `cmd & k=$!`: SIGKILL the watcher (the keeper's one child) `delay` s in."""
    return (
        f'sleep {delay:.3f}; w=; until [ -n "$w" ]; do '
        "w=$(cut -d' ' -f1 /proc/$k/task/$k/children 2>/dev/null); [ -n \"$w\" ] || sleep 0.01; "
        "done; "
        'kill -KILL "$w"; wait $k; echo "rc=$? watcher=$w"'
    )


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
@pytest.mark.parametrize("mode", ["shell-cgroup", "shell-pgroup"])
def test_watcher_sigkill_at_any_instant_leaves_nothing(
    mode: str, seed: int, ct: Container, work: Path
) -> None:
    """Issue 22 item 3: a watcher SIGKILLed at a seeded instant (starting, placing, running)
    leaves no process of its ranks (a multiprocessing worker, a subprocess child, a setsid
    daemon), no cgroup, no error-file directory; its keeper exits 137; the id runs again."""
    _, ro = MODES[mode]
    delay = random.Random(seed).uniform(0.0, 3.0)
    first = start(work, ro, "leak", "--sleep", "300", "--worker", "--grandchild", "--daemon")
    again = start(work, ro, "leak", "--sleep", "0")
    res = ct.run(
        f"{first} & k=$!; {kill_watcher_after(delay)}; "
        f"if ls {work}/*.pid >/dev/null 2>&1; then {alive_script(work)}; fi; {LEFT}; "
        f"ls /run/gpulaunch 2>/dev/null | grep -vx jobs | sed 's/^/ERRDIR /'; "
        f"{again}; echo again=$?"
    )
    print(f"seed {seed}: SIGKILL {delay:.3f} s after the start\n{res.stdout}")
    assert "rc=137 " in res.stdout, res.stdout
    assert "ALIVE" not in res.stdout and "LEFT" not in res.stdout, res.stdout
    assert "ERRDIR" not in res.stdout, res.stdout
    assert "again=0" in res.stdout, res.stdout
    assert ct.leftovers() == []


def test_cgroup_of_a_dead_watcher_and_keeper_does_not_block_the_id(
    ct: Container, work: Path
) -> None:
    """Watcher and keeper SIGKILLed together (the keeper stopped first): what the ranks started
    stays in the job's cgroup, but its watcher cgroup is empty: the next start of the same
    id removes it (killing what is left) and runs, instead of 73 "already running"."""
    first = start(work, False, "stale", "--sleep", "300", "--grandchild", "--daemon")
    again = start(work, False, "stale", "--sleep", "0")
    res = ct.run(
        f"{first} & k=$!; {ready(work)}; w=$(cut -d' ' -f1 /proc/$k/task/$k/children); "
        "kill -STOP $k; kill -KILL $w; kill -KILL $k; wait $k; "  # the keeper cannot act
        f"ls -d /sys/fs/cgroup/gpulaunch-stale && echo STALE; {again}; echo again=$?; "
        f"{alive_script(work)}"
    )
    assert "STALE" in res.stdout, res.stdout  # (the test itself: something was left)
    assert "again=0" in res.stdout, res.stdout
    assert "left by a job whose watcher is gone" in res.stdout, res.stdout
    assert "ALIVE" not in res.stdout, res.stdout
    assert ct.leftovers() == []


@pytest.mark.parametrize("mode", ["shell-cgroup", "shell-pgroup"])
def test_a_signal_to_the_jobs_process_group_reaches_the_watcher_once(
    mode: str, ct: Container, work: Path
) -> None:
    """^C (or bash's `kill %1`) signals the whole process group; the keeper passes it on
    and the watcher, a process group of its own, gets it once: a graceful stop (SIGTERM to
    the ranks, 130), not the "second signal" kill."""
    _, ro = MODES[mode]
    cmd = start(work, ro, "group", "--sleep", "300")
    pgid = "$(cut -d' ' -f5 /proc/$w/stat) $(cut -d' ' -f5 /proc/$k/stat)"
    res = ct.run(
        f"setsid {cmd} & k=$!; {ready(work)}; w=$(cut -d' ' -f1 /proc/$k/task/$k/children); "
        f'echo "pgids {pgid}"; kill -INT -$k; wait $k; echo rc=$?'
    )
    watcher, keeper = res.stdout.split("pgids ", 1)[1].split()[:2]
    assert watcher != keeper, res.stdout  # the group's signals reach the keeper alone
    assert "rc=130" in res.stdout, res.stdout
    report = res.stdout.split("stopped by SIGINT", 1)[-1]
    assert "SIGTERM  stopped" in report and "SIGKILL" not in report, res.stdout


def test_watcher_sigkill_as_pid1_ends_the_container(ct: Container, work: Path) -> None:
    """As PID 1, the watcher's death ends the pid namespace: the kernel kills everything."""
    proc = ct.popen(
        f"exec {start(work, False, 'kill1', '--sleep', '300', '--daemon')}",
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    watcher = first_child(proc.pid, lambda: proc.poll() is None)
    wait_until(lambda: all((work / f"rank{r}.ready").exists() for r in (0, 1)), 60, "ranks")
    os.kill(watcher, signal.SIGKILL)
    proc.wait(timeout=60)

    def procs() -> list[str]:
        return [p.read_text() for p in ct.cgroup.glob("**/cgroup.procs") if p.read_text().strip()]

    wait_until(lambda: not procs(), 10, "every process of the container to end")


def test_memory_max_where_the_controller_is_delegated(ct: Container, work: Path) -> None:
    """memory.max of each rank's cgroup; where the host delegates no memory controller to
    the container (this machine's hybrid cgroup2 has none), one warning says so."""
    show = "cat /sys/fs/cgroup$(grep ^0:: /proc/self/cgroup | cut -d: -f3)/memory.max || true"
    args = ["start", "--nproc", "1", "--memory-max", "64M", "--no-python", "sh", "-c", show]
    res = ct.run(gpulaunch(work, *args))
    assert res.returncode == 0, res.stdout
    if "memory" in ct.controllers():
        assert "[0] 67108864" in res.stdout, res.stdout
    else:
        assert "--memory-max is not enforced: the memory controller cannot be enabled" in (
            res.stdout
        )
    assert ct.leftovers() == []


@pytest.mark.parametrize("mode", ["shell-cgroup", "shell-pgroup"])
def test_sigusr1_reaches_the_ranks_and_the_job_goes_on(
    mode: str, ct: Container, work: Path
) -> None:
    """SIGUSR1 to the watcher, then `gpulaunch signal` (no bus: through its record file):
    each rank gets both, and the job ends as its ranks do (exit 0), not at the notice."""
    _, ro = MODES[mode]
    cmd = start(work, ro, "notice", "--until-usr1", "2")
    sig = gpulaunch(work, "signal", "notice", "USR1")
    status = gpulaunch(work, "status", "notice")
    one = f"[ $(cat {work}/rank0.usr1 {work}/rank1.usr1 2>/dev/null | wc -l) -ge 2 ]"
    res = ct.run(
        checked(
            work,
            f"{cmd} & w=$!; {ready(work)}; kill -USR1 $w; until {one}; do sleep 0.05; done; "
            f"{sig}; wait $w; rc=$?; {status}",
        )
    )
    assert res.returncode == 0, res.stdout
    assert "SIGUSR1 sent to 2 rank(s)" in res.stdout
    assert "job notice succeeded" in res.stdout  # the report, and `status` from the record
    for r in (0, 1):
        assert len((work / f"rank{r}.usr1").read_text().split()) == 2


def test_job_tools_after_a_sigkilled_watcher_without_a_bus(ct: Container, work: Path) -> None:
    """Issue 22 items 5 and 9, in a container without systemd or a bus: once the watcher is
    SIGKILLed its record still says `running`, but status/wait/signal check the watcher
    itself (76: it went away), `list` no longer counts it as running while `list --all`
    shows it; an unknown job is 3 for status, wait and signal alike; an ended job's signal
    says it ended."""
    cmd = start(work, True, "gone", "--sleep", "300")
    tool = {name: gpulaunch(work, *args) for name, args in {
        "status": ("status", "gone"), "wait": ("wait", "gone"),
        "signal": ("signal", "gone", "USR1"), "list": ("list",), "all": ("list", "--all"),
        "nosuch-status": ("status", "nosuch"),
        "nosuch-wait": ("wait", "nosuch"), "nosuch-signal": ("signal", "nosuch", "USR1"),
    }.items()}  # fmt: skip
    runs = "; ".join(f"echo '== {n}'; {c} 2>&1; echo \"rc {n}=$?\"" for n, c in tool.items())
    res = ct.run(
        f"{cmd} & k=$!; {ready(work)}; w=$(cut -d' ' -f1 /proc/$k/task/$k/children); "
        f"kill -KILL $w; wait $k; {runs}; {start(work, True, 'done', '--sleep', '0')}; "
        f'{gpulaunch(work, "signal", "done", "USR1")} 2>&1; echo "rc ended-signal=$?"'
    )
    out = res.stdout
    for name in ("status", "wait", "signal"):
        assert f"rc {name}=76" in out, out
    assert "went away without saying how the job ended" in out, out
    for name in ("nosuch-status", "nosuch-wait", "nosuch-signal"):
        assert f"rc {name}=3" in out, out
    assert "rc list=0" in out and "rc all=0" in out, out
    listed = out.split("== list\n", 1)[1].split("== all\n")
    assert "gone" not in listed[0].split("rc list=")[0], out  # not running
    assert "gone" in listed[1].split("rc all=")[0], out
    assert "rc ended-signal=3" in out and "job 'done' is not running: it ended" in out, out


FORGED_PID = 987654321


def forged_record(where: Path) -> str:
    """A running job's record as gpulaunch writes it, naming FORGED_PID as its watcher."""
    rank = RankView(
        rank=0, local_rank=0, unit="u", pid=FORGED_PID, state="running", exit_code=-1,
        signal=0, stopped_by_watcher=False, status=-1, runtime=0.0,
    )  # fmt: skip
    view = JobView(
        job="fakejob", slice="s", manager="system", owner=0, watcher_pid=FORGED_PID,
        state=JobState.RUNNING, world_size=1, ranks=(rank,),
    )  # fmt: skip
    return filerecord.write(view, "job fakejob started", where).read_text()


def test_root_ignores_a_hostile_home_for_the_record_file(ct: Container, work: Path) -> None:
    """Issue 22 item 4: root with HOME/XDG_STATE_HOME of another user (sudo -E): her forged
    record naming a live root process is not read (nothing signalled), her `jobs` link to a
    root directory is neither written through nor pruned; root's record is in /run."""
    hostile = work / "mallory"
    (hostile / "gpulaunch").mkdir(parents=True)
    victim_dir = work / "rootdir"
    victim_dir.mkdir(mode=0o700)
    for i in range(3):
        (victim_dir / f"{i}.json").write_text("{}")
    (hostile / "gpulaunch" / "jobs").symlink_to(victim_dir)
    forged = forged_record(work / "forge" / "gpulaunch" / "jobs")
    env = f"env HOME={hostile} XDG_STATE_HOME={hostile}"
    job = shlex.join([GPULAUNCH, "start", "--nproc", "1", "--job", "mine", "--no-python", "true"])
    sig = shlex.join([GPULAUNCH, "signal", "fakejob", "USR1"])
    res = ct.run(
        f"sleep 300 & v=$!; echo {shlex.quote(forged)} >/tmp/forged; "
        f"for n in fakejob@$(hostname).json fakejob.json; do "
        f"sed s/{FORGED_PID}/$v/g /tmp/forged >{victim_dir}/$n; done; "
        f"{env} {sig} 2>&1; echo rc-signal=$?; "
        f"{env} {job} 2>&1; echo rc-job=$?; ls /run/gpulaunch/jobs; "
        f"[ -e /proc/$v ] && echo VICTIM-ALIVE"
    )
    out = res.stdout
    assert "rc-signal=3" in out and "VICTIM-ALIVE" in out, out
    assert "rc-job=0" in out and "mine@" in out, out
    assert {p.name for p in victim_dir.iterdir()} >= {"0.json", "1.json", "2.json"}
    assert not any(p.name.startswith("mine") for p in victim_dir.iterdir())
