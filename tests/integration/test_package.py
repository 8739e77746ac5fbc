"""From `pip install gpulaunch` to a first job, with the package alone (no repository).

Builds the sdist and the wheel, installs the wheel into a fresh virtual environment
inside a fresh box (its /tmp, which the host's repository is not on), and runs there
what a new user would: --version, a job before `gpulaunch setup` (it runs, with one
warning), setup, a job with its job API on, doctor, the man page and the completions.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpulaunch.system.files import ALL
from gpulaunch.units.templates import TEMPLATE_NAMES
from sdbox import Box

REPO = Path(__file__).resolve().parents[2]
VENV = "/tmp/venv"  # inside the box: its own fresh tmpfs
GL = f"{VENV}/bin/gpulaunch"
WORK = "/tmp/work"  # the job's directory inside the box
POLICY = "/etc/dbus-1/system.d/io.gpulaunch.conf"
DROP_IN = "/etc/systemd/journald.conf.d/60-gpulaunch.conf"

pytestmark = pytest.mark.integration

TRAIN = """\
import os, signal, sys
rank = os.environ["RANK"]
print(f"rank {rank} of {os.environ['WORLD_SIZE']} says hello", flush=True)
if sys.argv[1:] == ["--block"]:
    open(f"{os.environ['READY_DIR']}/rank{rank}.ready", "w").close()
    signal.pause()  # until the job is stopped
"""

# Completes a command line the way bash does on TAB, with bash-completion loaded.
COMPLETE = r"""
source /usr/share/bash-completion/bash_completion
source "$1"; shift
fn=$(complete -p gpulaunch | sed -E 's/.*-F ([^ ]+).*/\1/')
COMP_LINE="$*"; COMP_POINT=${#COMP_LINE}
read -ra COMP_WORDS <<< "$COMP_LINE"
COMP_CWORD=$((${#COMP_WORDS[@]} - 1))
"$fn" gpulaunch "${COMP_WORDS[-1]}" "${COMP_WORDS[-2]}"
printf '%s\n' "${COMPREPLY[@]}"
"""


@pytest.fixture(scope="module")
def dist() -> Iterator[Path]:
    """The sdist, the wheel and the wheels of its dependencies, in a folder the box can bind."""
    with tempfile.TemporaryDirectory(dir="/var/tmp", prefix="gpulaunch-dist-") as tmp:
        out = Path(tmp)
        subprocess.run(
            [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(REPO)],
            check=True,
            capture_output=True,
        )
        (wheel,) = out.glob("gpulaunch-*.whl")
        # The dependencies' wheels (pystemd is built once, then pip's cache has it).
        subprocess.run(
            [sys.executable, "-m", "pip", "wheel", "-q", "--wheel-dir", str(out), str(wheel)],
            check=True,
            capture_output=True,
        )
        (out / "train.py").write_text(TRAIN)
        (out / "complete.sh").write_text(COMPLETE)
        yield out


def test_the_sdist_and_the_wheel_carry_what_an_installation_needs(dist: Path) -> None:
    (wheel,) = dist.glob("gpulaunch-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    data = f"{wheel.name.split('-py3')[0]}.data/data/share"
    # Every unit template and every file `setup` installs, from the top-level units/ and
    # packaging/, as package data (gpulaunch/shipped.py finds them there).
    templates = sorted(p.name for p in (REPO / "units").iterdir())
    assert set(templates) >= set(TEMPLATE_NAMES), templates
    installed = [str(f.source.relative_to(REPO)) for f in ALL]
    assert all(name.startswith("packaging/") for name in installed), installed
    for shipped in (
        *(f"gpulaunch/_shipped/units/{name}" for name in templates),
        *(f"gpulaunch/_shipped/{name}" for name in installed),
        "gpulaunch/_shipped/packaging/dbus/io.gpulaunch.Job1.xml",
        f"{data}/bash-completion/completions/gpulaunch",
        f"{data}/zsh/site-functions/_gpulaunch",
        f"{data}/man/man1/gpulaunch.1",
    ):
        assert shipped in names, shipped
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    metadata = zipfile.ZipFile(wheel).read(
        next(n for n in names if n.endswith(".dist-info/METADATA"))
    )
    assert b"License-Expression: MIT" in metadata
    # Every dependency the wheel declares is imported by gpulaunch (none is dead weight).
    declared = {
        line.split(":", 1)[1].split(";")[0].strip().split(">")[0].split("=")[0].split("<")[0]
        for line in metadata.decode().splitlines()
        if line.startswith("Requires-Dist:") and "extra ==" not in line
    }
    imports = {"dbus-fast": "dbus_fast", "setproctitle": "setproctitle"}
    source = "\n".join(p.read_text() for p in (REPO / "gpulaunch").rglob("*.py"))
    for dep in declared:
        module = imports.get(dep, dep.replace("-", "_"))
        assert f"import {module}" in source or f"from {module}" in source, dep
    (sdist,) = dist.glob("gpulaunch-*.tar.gz")
    top = sdist.name.removesuffix(".tar.gz")
    members = set(tarfile.open(sdist).getnames())
    for source in ("LICENSE", "hatch_build.py", "units/rank.scope", *installed):
        assert f"{top}/{source}" in members, source
    # Generated at build time, never committed.
    assert not any("completions" in m or m.endswith(".1") for m in members)


@pytest.fixture(scope="module")
def box(dist: Path) -> Iterator[Box]:
    """A fresh box with the wheel installed into a fresh venv, as pip would for a user.

    Only the dist folder is bound; the box's system side starts without gpulaunch's
    policy or journald drop-in, whatever the host has.
    """
    with Box(binds=[dist]) as b:
        run(b, "rm", "-f", POLICY, DROP_IN, *(f.target for f in ALL))
        reload_bus(b)
        run(b, "python3", "-m", "venv", VENV)  # the system Python, as a user has
        run(
            b,
            f"{VENV}/bin/pip",
            "install",
            "-q",
            "--no-index",
            "--find-links",
            str(dist),
            str(next(dist.glob("gpulaunch-*.whl"))),
        )
        run(b, "mkdir", "-p", WORK)
        run(b, "cp", str(dist / "train.py"), WORK)
        yield b


def run(box: Box, *argv: str, check: bool = True, **kw: Any) -> subprocess.CompletedProcess[str]:
    """argv in the box, in the job's directory (off the repository), with a clean PATH."""
    env = {"PATH": f"{VENV}/bin:/usr/sbin:/usr/bin:/sbin:/bin", "OMP_NUM_THREADS": "1"}
    kw.setdefault("timeout", 120)
    res = box.run(
        ["env", "-i", *(f"{k}={v}" for k, v in env.items()), *argv],
        cwd="/",
        capture_output=True,
        **kw,
    )
    if check:
        assert res.returncode == 0, (argv, res.stdout, res.stderr)
    return res


def reload_bus(box: Box) -> None:
    run(box, "busctl", "call", "org.freedesktop.DBus", "/org/freedesktop/DBus",
        "org.freedesktop.DBus", "ReloadConfig")  # fmt: skip


def in_work(*argv: str) -> list[str]:
    return ["sh", "-c", 'cd "$0" && exec "$@"', WORK, *argv]


def warnings(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("gpulaunch: warning:")]


def test_a_pip_installed_gpulaunch_from_first_job_to_doctor(box: Box, dist: Path) -> None:
    # The package alone: gpulaunch comes from the venv, not from the repository.
    where = run(box, f"{VENV}/bin/python", "-c", "import gpulaunch; print(gpulaunch.__file__)")
    assert where.stdout.startswith(f"{VENV}/lib/"), where.stdout
    assert run(box, GL, "--version").stdout.strip() == "gpulaunch 0.1.0"

    # render: the units from the installed copy of the templates, the same text as from the
    # repository's units/.
    rendered = run(box, *in_work(GL, "render", "--job", "pk", "--nproc", "2", "train.py"))
    shipped = where.stdout.strip().removesuffix("__init__.py") + "_shipped/units"
    assert f"(from {shipped}/rank.scope)" in rendered.stdout, rendered.stdout
    here = subprocess.run(
        [sys.executable, "-m", "gpulaunch", "render", "--job", "pk", "--nproc", "2", "train.py"],
        cwd=dist,
        capture_output=True,
        text=True,
        check=True,
    )

    def same(text: str, units: str) -> str:
        # the anchor runs this Python and waits for this process: the only differences
        return re.sub(
            r"^ExecStart=.*$", "ExecStart=...", text.replace(units, "<units>"), flags=re.M
        )

    assert same(rendered.stdout, shipped) == same(here.stdout, str(REPO / "units"))
    assert f'ExecStart="{VENV}/bin/python' in rendered.stdout  # the anchor, with the wheel's

    # Before setup: the job runs; one warning names the command that turns the API on.
    first = run(box, *in_work(GL, "start", "--nproc", "2", "train.py"))
    assert "rank 1 of 2 says hello" in first.stdout + first.stderr
    (warning,) = warnings(first.stderr)
    assert "job API" in warning and warning.endswith("sudo gpulaunch setup"), warning

    # An ordinary user with a user manager: the same package runs a job of theirs.
    run(box, "useradd", "--create-home", "glpkg")
    uid = run(box, "id", "-u", "glpkg").stdout.strip()
    run(box, "systemctl", "start", f"user@{uid}.service")
    user = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--init-groups", "env",
            "HOME=/home/glpkg", f"XDG_RUNTIME_DIR=/run/user/{uid}"]  # fmt: skip
    theirs = run(box, *user, *in_work(GL, "start", "--nproc", "2", "train.py"))
    assert "rank 1 of 2 says hello" in theirs.stdout + theirs.stderr
    assert warnings(theirs.stderr) == [], theirs.stderr
    their_doctor = run(box, *user, GL, "doctor", "--json").stdout
    assert json.loads(their_doctor)["can_run"] is True, their_doctor

    # setup installs the policy from the package, says so, and is idempotent.
    done = run(box, GL, "setup")
    assert f"gpulaunch setup: installed {POLICY}" in done.stdout, done.stdout
    assert "reloaded" in done.stdout
    # gpulaunch.slice from packaging/, for the system manager (reloaded), and /run/gpulaunch
    fragment = run(box, "systemctl", "show", "-P", "FragmentPath", "gpulaunch.slice").stdout
    assert fragment.strip() == "/etc/systemd/system/gpulaunch.slice", done.stdout
    assert "created /run/gpulaunch" in done.stdout, done.stdout
    assert run(box, "stat", "-c", "%a %U", "/run/gpulaunch").stdout.split() == ["755", "root"]
    again = run(box, GL, "setup")
    assert f"unchanged {POLICY}" in again.stdout and "nothing to change" in again.stdout

    # After setup: no warning, and the job is on the bus while it runs.
    ready = f"READY_DIR={WORK}"
    started = run(box, "env", ready, *in_work(GL, "start", "-d", "--job", "pk", "--nproc", "2",
                                               "train.py", "--block"))  # fmt: skip
    assert warnings(started.stderr) == [], started.stderr
    run(box, "sh", "-c", f"until [ -e {WORK}/rank1.ready ]; do sleep 0.05; done", timeout=60)
    status = json.loads(run(box, GL, "status", "pk", "--json").stdout)
    assert status["state"] == "running", status
    owners = run(box, "busctl", "status", "io.gpulaunch.job.pk").stdout
    assert "PID=" in owners
    run(box, GL, "stop", "pk", check=False)
    run(box, GL, "wait", "pk", check=False)

    # doctor: a table with fixes, and JSON; both say a job can run.
    table = run(box, GL, "doctor").stdout
    assert "a job can run here" in table, table
    policy_row = next(line for line in table.splitlines() if "bus policy" in line)
    assert " ok " in policy_row, table
    assert "fix: sudo gpulaunch setup --journald --restart-journald" in table  # journald: default
    report = json.loads(run(box, GL, "doctor", "--json").stdout)
    assert report["can_run"] is True and report["supervisor"] == "systemd", report
    assert {c["area"] for c in report["checks"]} >= {
        "supervisor", "systemd", "job API", "journald", "cgroups", "limits", "gpu"
    }  # fmt: skip

    # --journald installs the drop-in; --uninstall removes everything.
    journald = run(box, GL, "setup", "--journald", "--restart-journald")
    assert f"installed {DROP_IN}" in journald.stdout and "restarted" in journald.stdout
    assert "rate limit" in run(box, GL, "doctor").stdout
    gone = run(box, GL, "setup", "--uninstall")
    assert f"removed {POLICY}" in gone.stdout and f"removed {DROP_IN}" in gone.stdout

    # The man page renders, and bash completes subcommands and options.
    man = run(box, "man", "-l", f"{VENV}/share/man/man1/gpulaunch.1").stdout
    assert "gpulaunch doctor" in man and "gpulaunch setup" in man, man
    bash_completion = f"{VENV}/share/bash-completion/completions/gpulaunch"
    complete = ["bash", str(dist / "complete.sh"), bash_completion]
    completed = run(box, *complete, "gpulaunch", "st").stdout.split()
    assert sorted(completed) == ["stacks", "start", "status", "stop"], completed
    options = run(box, *complete, "gpulaunch", "start", "--nproc-per").stdout.split()
    assert options == ["--nproc-per-node"], options


def test_installing_gpulaunch_leaves_lightning_on_tqdm(box: Box) -> None:
    """Issue 22, item 16: Lightning's default progress bar and model summary are Rich's when
    `rich` can be imported (lightning/pytorch/trainer/connectors/callback_connector.py), so
    a dependency on rich changed the user's training output. A fresh install has none."""
    installed = json.loads(run(box, f"{VENV}/bin/pip", "list", "--format", "json").stdout)
    names = {p["name"].lower() for p in installed}
    assert "gpulaunch" in names and "rich" not in names, names
    found = run(
        box, f"{VENV}/bin/python", "-c", "import importlib.util as u; print(u.find_spec('rich'))"
    )
    assert found.stdout.strip() == "None"
    # ...and what needed it, the resources table, works without it.
    top = run(box, GL, "top", "--once", "--interval", "0.1", check=False)
    assert top.returncode == 0, top.stderr
    assert "no jobs on" in top.stdout, top.stdout
