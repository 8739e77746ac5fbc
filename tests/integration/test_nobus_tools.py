"""Every job tool where `start` runs without systemd or a bus (issue 35 item 5): a container
(tests/integration/container.py) as Docker or CI makes one, a detached job (`start -d`) of the
direct supervisor, as root and as an ordinary user.

`stop`, `top` and `signal` (a notice, or SIGTERM/SIGINT: a stop) act through the job's record
file: root's own in /run/gpulaunch/jobs, a user's in their state directory; the watcher it
names is signalled through a pidfd checked to be that very process. Root never acts on a
record an ordinary user could have written.

The ordinary user is `nobody`: this machine's Python lives under /root (0700), so the
container's own mount namespace lays a 0711 tmpfs over /root with the Python bound back in
(the host's /root is untouched).
"""

from __future__ import annotations

import shlex
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.container import LEFT, Container, alive_script, container
from tests.integration.jobs import GPULAUNCH, RANK_SCRIPT, SHARED

pytestmark = pytest.mark.integration

PYTHON_HOME = "/root/.pyenv"
# the container's own view of /root: traversable, with this machine's Python in it
USER_ROOT = (
    f"mkdir -p /run/py && mount --bind {PYTHON_HOME} /run/py && "
    f"mount -t tmpfs -o mode=711 none /root && mkdir -p {PYTHON_HOME} && "
    f"mount --bind /run/py {PYTHON_HOME}"
)
AS_USER = "setpriv --reuid=nobody --regid=nogroup --clear-groups --"
WHO = {"root": "", "user": AS_USER}


@pytest.fixture
def work() -> Iterator[Path]:
    d = SHARED / f"nobus-tools-{uuid.uuid4().hex[:8]}"
    d.mkdir(parents=True)
    d.chmod(0o777)
    (d / "state").mkdir(mode=0o777)
    (d / "state").chmod(0o777)
    yield d


@pytest.fixture(params=["cgroup", "pgroup"])
def ct(request: pytest.FixtureRequest) -> Iterator[Container]:
    with container(read_only=request.param == "pgroup") as c:
        yield c


def tool(work: Path, who: str, *args: str) -> str:
    """`gpulaunch ARGS` as `who`, with the user's state directory (root ignores it)."""
    return f"{WHO[who]} env XDG_STATE_HOME={work}/state " + shlex.join([GPULAUNCH, *args])


def detached(work: Path, who: str, job: str) -> str:
    start = tool(
        work, who, "start", "-d", "--nproc", "2", "--job", job, "--grace", "5",
        RANK_SCRIPT, "--dir", str(work), "--sleep", "300", "--grandchild", "--daemon",
    )  # fmt: skip
    ready = f"while [ ! -e {work}/rank0.ready ] || [ ! -e {work}/rank1.ready ]; do sleep 0.05; done"
    return f"{USER_ROOT}; {start} >{work}/start.out 2>&1; echo rc-start=$?; {ready}"


def run(work: Path, *lines: tuple[str, str]) -> str:
    """Each (name, command) with its output and `rc NAME=...`, then what is left."""
    body = "; ".join(f"echo '== {n}'; {c} 2>&1; echo \"rc {n}=$?\"" for n, c in lines)
    return f"{body}; {alive_script(work)}; {LEFT}"


def section(out: str, name: str) -> str:
    return out.split(f"== {name}\n", 1)[1].split(f"rc {name}=", 1)[0]


def assert_nothing_left(out: str, ct: Container) -> None:
    assert "ALIVE" not in out and "LEFT" not in out, out
    assert ct.leftovers() == []


@pytest.mark.parametrize("who", ["root", "user"])
def test_stop_and_top_of_a_detached_job_without_a_bus(who: str, ct: Container, work: Path) -> None:
    """`top` shows the job from its record; `stop` ends it (SIGTERM, the grace) and returns
    once nothing of it is left: no rank, no grandchild, no daemon, no cgroup."""
    res = ct.run(
        detached(work, who, "dj")
        + "; "
        + run(
            work,
            ("top", tool(work, who, "top", "--once", "--interval", "0.3")),
            ("topjob", tool(work, who, "top", "dj", "--once", "--interval", "0.3")),
            ("rank", tool(work, who, "signal", "dj", "TERM", "--rank", "1")),
            ("stop", tool(work, who, "stop", "dj")),
            ("again", tool(work, who, "stop", "dj")),
        )
    )
    out = res.stdout
    assert "rc-start=0" in out, (out, (work / "start.out").read_text())
    for name in ("top", "topjob"):
        assert f"rc {name}=0" in out, out
        assert "job dj: running, 2 ranks" in section(out, name), out
        assert "no bus answers here" in section(out, name), out
    assert "rc rank=2" in out and "stops the whole job, not one rank" in out, out
    assert "rc stop=0" in out and "job dj stopped by SIGTERM (status 143)" in out, out
    assert "cannot reach" not in section(out, "stop"), out
    assert "rc again=3" in out and "job 'dj' is not running: it ended" in out, out
    assert_nothing_left(out, ct)


@pytest.mark.parametrize(("who", "sig", "status"), [("root", "INT", 130), ("user", "TERM", 143)])
def test_signal_stops_a_detached_job_without_a_bus(
    who: str, sig: str, status: int, ct: Container, work: Path
) -> None:
    """`gpulaunch signal JOB TERM|INT` reaches the watcher as that signal: the job stops
    with its status, as a `kill` of the watcher would."""
    res = ct.run(
        detached(work, who, "sj")
        + "; "
        + run(
            work,
            ("signal", tool(work, who, "signal", "sj", sig)),
            ("wait", tool(work, who, "wait", "sj")),
        )
    )
    out = res.stdout
    assert "rc signal=0" in out and f"SIG{sig} sent to its watcher" in out, out
    assert f"rc wait={status}" in out, out
    assert_nothing_left(out, ct)


def test_root_never_acts_on_a_users_record(ct: Container, work: Path) -> None:
    """A user's job, and root with that user's state directory (sudo -E): root's stop, top
    and signal read root's records only: no job; the user's job runs on until they stop it."""
    res = ct.run(
        detached(work, "user", "uj")
        + "; "
        + run(
            work,
            ("root-stop", tool(work, "root", "stop", "uj")),
            ("root-signal", tool(work, "root", "signal", "uj", "TERM")),
            ("root-top", tool(work, "root", "top", "uj", "--once", "--interval", "0.1")),
            ("alive", f"{alive_script(work)}"),
            ("stop", tool(work, "user", "stop", "uj")),
        )
    )
    out = res.stdout
    for name in ("root-stop", "root-signal", "root-top"):
        assert f"rc {name}=3" in out, out
    assert "ALIVE" in section(out, "alive"), out  # the user's job was not touched
    assert "rc stop=0" in out and "job uj stopped by SIGTERM (status 143)" in out, out
    assert_nothing_left(out.split("rc stop=", 1)[1], ct)


def test_a_sigkilled_launcher_is_named_in_the_report(ct: Container, work: Path) -> None:
    """The keeper (the pid the shell knows) SIGKILLed: the watcher stops the job as on a
    SIGTERM (PR_SET_PDEATHSIG), and its report says why, not "stopped by SIGTERM"."""
    start = tool(
        work, "root", "start", "--nproc", "2", "--job", "kj", "--grace", "5",
        RANK_SCRIPT, "--dir", str(work), "--sleep", "300",
    )  # fmt: skip
    ready = f"while [ ! -e {work}/rank0.ready ] || [ ! -e {work}/rank1.ready ]; do sleep 0.05; done"
    res = ct.run(
        f"{start} >{work}/start.out 2>&1 & k=$!; {ready}; kill -KILL $k; echo keeper=$k; "
        + run(
            work,
            ("wait", tool(work, "root", "wait", "kj")),
            ("status", tool(work, "root", "status", "kj")),
        )  # fmt: skip
    )
    out = res.stdout
    keeper = out.split("keeper=", 1)[1].split()[0]
    assert "rc wait=143" in out, out
    said = f"job kj stopped by the death of its launcher (pid {keeper}) (status 143)"
    assert said in section(out, "status") and said in section(out, "wait"), out
    assert "stopped by SIGTERM" not in out, out
    assert_nothing_left(out, ct)


def test_a_direct_jobs_tools_say_what_is_true(ct: Container, work: Path) -> None:
    """Issue 35: for a job of the direct supervisor, `status` and `list` name its cgroup (or
    process groups) and no manager, not a slice and a system manager that do not exist;
    a running rank's runtime is its time so far, not "-"; `--resources` does not call the
    same version "older"; the ranks get no GPULAUNCH_UNIT (there is no unit)."""
    unit = "echo unit=${GPULAUNCH_UNIT-unset} job=$GPULAUNCH_JOB"
    res = ct.run(
        detached(work, "root", "tj")
        + "; "
        + run(
            work,
            ("status", tool(work, "root", "status", "tj")),
            ("resources", tool(work, "root", "status", "tj", "--resources")),
            ("list", tool(work, "root", "list")),
            ("stop", tool(work, "root", "stop", "tj")),
            ("ended", tool(work, "root", "status", "tj")),
            ("env", tool(work, "root", "start", "--job", "ej", "--no-python", "sh", "-c", unit)),
        )
    )
    out = res.stdout
    where = "process groups" if ct.read_only else "cgroup /sys/fs/cgroup/gpulaunch-tj"
    status = section(out, "status")
    assert f"2 ranks in {where} (direct supervisor, no manager, watcher pid " in status, out
    for name in ("status", "list", "ended"):
        said = section(out, name)
        assert ".slice" not in said and "system manager" not in said, out
    running = [line.split() for line in status.splitlines() if " running " in line]
    assert len(running) == 2 and all(row[-1] != "-" for row in running), status
    assert f"({where}, direct supervisor, no manager, ended " in section(out, "ended"), out
    resources = section(out, "resources")
    assert "last output" in resources and "older gpulaunch" not in resources, out
    assert "[0] unit=unset job=ej" in section(out, "env"), out
    assert_nothing_left(out, ct)
