"""A manager that exists but does not answer yet is not "no systemd" (issue 22, item 14).

Right after boot (or during a daemon-reexec) the manager's socket is there but a
connection fails for a moment ("Could not open a bus to DBus"): `--supervisor auto` took
that for no systemd and ran the job under the direct supervisor (1 of 14 jobs after boot).
Here the system manager's private socket is, for one connection, a stand-in that hangs up
at once; the job must ask again and get systemd's supervision.
"""

from __future__ import annotations

import subprocess

import pytest

from tests.integration.jobs import Job

pytestmark = pytest.mark.integration

# In the box: the real socket moved aside, a stand-in that hangs up on the first connection,
# then the real socket back in its place (rename(2): atomic), "restored" once done.
STAND_IN = r"""
import os, socket, sys
real, aside = "/run/systemd/private", "/run/systemd/private.real"
os.rename(real, aside)
s = socket.socket(socket.AF_UNIX)
s.bind(real)
s.listen(8)
print("ready", flush=True)
conn, _ = s.accept()
conn.close()
os.rename(aside, real)
print("restored", flush=True)
"""


def test_auto_asks_again_a_manager_that_does_not_answer_yet(job: Job) -> None:
    stand_in = job.box.popen(
        ["python3", "-c", STAND_IN], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert stand_in.stdout is not None
        assert stand_in.stdout.readline().strip() == "ready", stand_in.stderr
        res = job.run("--nproc", "1", "--supervisor", "auto")
        out, err = stand_in.communicate(timeout=60)
    finally:
        if stand_in.poll() is None:  # never connected to: put the real socket back
            stand_in.kill()
            job.box.run(["mv", "/run/systemd/private.real", "/run/systemd/private"])
    assert out.strip() == "restored", err  # the job did meet the hang-up
    assert res.returncode == 0, res.stderr
    assert "systemd supervisor" in res.stderr and "direct supervisor" not in res.stderr, res.stderr
