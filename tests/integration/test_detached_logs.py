"""`gpulaunch logs` of a detached job on a host without systemd (issue 35, item 5).

A container as Docker makes one (tests/integration/container.py: an empty /run, no
systemd, no journald): `gpulaunch start -d` used to lose every line of the ranks' output,
and `gpulaunch logs JOB` said "no logs ... check the job id". Now the watcher keeps them
beside the job's record (logs/spool.py), where `logs` reads them, `-f` included. As root:
this machine's Python lives under /root, which an ordinary user may not enter
(test_direct.py); a user's spool is beside a user's record, in $XDG_STATE_HOME, tested in
tests/unit/test_spool.py.
"""

from __future__ import annotations

import shlex
import uuid
from pathlib import Path

import pytest

from tests.integration.container import container
from tests.integration.jobs import GPULAUNCH, REPO

pytestmark = pytest.mark.integration

TALK = str(REPO / "tests" / "integration" / "scripts" / "talk.py")


def gl(*args: str) -> str:
    return shlex.join([GPULAUNCH, *args])


def test_a_detached_jobs_output_is_in_gpulaunch_logs_without_journald(tmp_path: Path) -> None:
    job = f"detached-{uuid.uuid4().hex[:6]}"
    talk = ["--lines", "3", "--stderr", "1"]
    script = "; ".join(
        [
            f"{gl('start', '-d', '--nproc', '2', '--job', job, TALK, *talk)} >{tmp_path}/id",
            f"{gl('logs', '-f', job)} >{tmp_path}/follow 2>{tmp_path}/follow.err",
            f"echo $? >{tmp_path}/follow.rc",
            f"{gl('logs', job)} >{tmp_path}/out 2>{tmp_path}/err",
            f"{gl('logs', job, '--rank', '1', '-n', '2')} >{tmp_path}/tail 2>&1",
            f"ls /run/gpulaunch/jobs >{tmp_path}/ls",
        ]
    )
    with container() as ct:
        res = ct.run(script, timeout=120)
    assert res.returncode == 0, res.stdout
    assert (tmp_path / "id").read_text().strip() == job
    out = (tmp_path / "out").read_text().splitlines()
    for rank in range(2):
        assert [x for x in out if x.startswith(f"[{rank}] ")] == [
            f"[{rank}] rank {rank} line {i}" for i in range(3)
        ], out
    err = (tmp_path / "err").read_text()
    assert "[0] rank 0 err 0" in err and "[1] rank 1 err 0" in err, err
    assert "no logs" not in err
    # -f: the same lines, then the job's end: its report, and its status
    assert (tmp_path / "follow.rc").read_text().strip() == "0"
    follow = (tmp_path / "follow").read_text().splitlines()
    assert sorted(follow) == sorted(out)
    follow_err = (tmp_path / "follow.err").read_text()
    assert f"job {job} succeeded (all 2 ranks exited 0)" in follow_err, follow_err
    # --rank and -n count that rank's lines
    assert (tmp_path / "tail").read_text().splitlines() == ["[1] rank 1 line 2", "[1] rank 1 err 0"]
    # the record and the spool, beside it (removed with it: tests/unit/test_spool.py)
    assert sorted(Path(n).suffix for n in (tmp_path / "ls").read_text().split()) == [
        ".json",
        ".logs",
    ]
