"""The distribution recipe (packaging/debian/): built in CI, installed, and a job runs.

`scripts/build-deb.sh` builds the .deb from this checkout (dpkg-buildpackage -b: gpulaunch
and the dependencies Debian 12 ships too old, pystemd and dbus-fast, in a private venv under
/usr/lib/gpulaunch; the system side from packaging/). It is installed with dpkg in a fresh
box (an overlay root: the host is untouched), where root and an ordinary user each run a
job with /usr/bin/gpulaunch, and it is removed again. Needs dpkg-dev and debhelper
(scripts/setup.sh) and the package index for the dependencies' wheels.
"""

from __future__ import annotations

import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sdbox import Box

REPO = Path(__file__).resolve().parents[2]
POLICY = "/etc/dbus-1/system.d/io.gpulaunch.conf"
TRAIN = (
    "import os; print(f\"rank {os.environ['RANK']} of {os.environ['WORLD_SIZE']} says hello\")\n"
)

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def deb() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(dir="/var/tmp", prefix="gpulaunch-deb-") as tmp:
        res = subprocess.run(
            ["bash", str(REPO / "scripts" / "build-deb.sh"), tmp],
            capture_output=True,
            text=True,
            timeout=900,
        )
        assert res.returncode == 0, res.stderr[-3000:]
        (built,) = Path(tmp).glob("gpulaunch_*.deb")
        (Path(tmp) / "train.py").write_text(TRAIN)
        yield built


def run(box: Box, *argv: str, check: bool = True, **kw: Any) -> subprocess.CompletedProcess[str]:
    env = ["env", "-i", "PATH=/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root", "OMP_NUM_THREADS=1"]
    res = box.run([*env, *argv], cwd="/", capture_output=True, text=True, timeout=180, **kw)
    if check:
        assert res.returncode == 0, (argv, res.stdout, res.stderr)
    return res


def test_the_deb_installs_runs_jobs_and_goes_away(deb: Path) -> None:
    files = subprocess.run(["dpkg-deb", "-c", str(deb)], capture_output=True, text=True).stdout
    for path in (
        "./usr/lib/gpulaunch/bin/gpulaunch",
        "./usr/bin/gpulaunch",
        f".{POLICY}",
        "./usr/lib/systemd/system/gpulaunch.slice",
        "./usr/lib/systemd/user/gpulaunch.slice",
        "./usr/lib/tmpfiles.d/gpulaunch.conf",
        "./usr/share/man/man1/gpulaunch.1",
        "./usr/share/bash-completion/completions/gpulaunch",
    ):
        assert path in files, path
    assert "site-packages/pystemd/" in files and "site-packages/dbus_fast/" in files
    assert "/gpulaunch/_shipped/units/anchor.service" in files

    with Box(binds=[deb.parent]) as box:
        run(box, "rm", "-f", POLICY)  # whatever the host has: the package brings its own
        installed = run(box, "dpkg", "-i", str(deb))
        assert "Setting up gpulaunch" in installed.stdout, installed.stdout
        where = run(box, "readlink", "-f", "/usr/bin/gpulaunch").stdout.strip()
        assert where == "/usr/lib/gpulaunch/bin/gpulaunch"
        run(box, "mkdir", "-p", "/srv/job")
        run(box, "cp", str(deb.parent / "train.py"), "/srv/job/")
        job = ["sh", "-c", 'cd /srv/job && exec "$@"', "-"]

        # root's job, with its job API: the package installed the policy, no warning
        first = run(box, *job, "gpulaunch", "start", "--nproc", "2", "train.py")
        assert "rank 1 of 2 says hello" in first.stdout + first.stderr
        assert "warning" not in first.stderr, first.stderr
        assert "unchanged /etc/dbus-1/system.d" in run(box, "gpulaunch", "setup").stdout
        assert run(box, "test", "-d", "/run/gpulaunch", check=False).returncode == 0
        rendered = run(box, *job, "gpulaunch", "render", "--nproc", "1", "train.py").stdout
        assert "(from /usr/lib/gpulaunch/lib/" in rendered and "anchor.service" in rendered

        # an ordinary user's job, under their user manager
        run(box, "useradd", "--create-home", "gldeb")
        uid = run(box, "id", "-u", "gldeb").stdout.strip()
        run(box, "systemctl", "start", f"user@{uid}.service")
        run(box, "chmod", "a+rx", "/srv/job")
        user = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--init-groups", "env",
                "HOME=/home/gldeb", f"XDG_RUNTIME_DIR=/run/user/{uid}"]  # fmt: skip
        theirs = run(box, *user, *job, "gpulaunch", "start", "--nproc", "2", "train.py")
        assert "rank 1 of 2 says hello" in theirs.stdout + theirs.stderr, theirs.stderr

        man = run(box, "man", "-w", "gpulaunch").stdout.strip()
        assert man == "/usr/share/man/man1/gpulaunch.1.gz", man
        run(box, "dpkg", "--purge", "gpulaunch")
        left = run(box, "ls", "/usr/lib/gpulaunch", "/usr/bin/gpulaunch", POLICY, check=False)
        assert left.returncode != 0 and not left.stdout.strip(), left.stdout
