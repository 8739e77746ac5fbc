"""A multi-node watcher imports what runs the job while its peer joins the other nodes
(start.py `_join`; issue 27's start profile, bench/nodestart.py)."""

from __future__ import annotations

import ast
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# In a fresh interpreter: start._join with a peer that notes, when it is asked to join,
# which of the watcher's modules are already imported (then stops the join).
PROBE = """
import sys, types
from contextlib import ExitStack
if "--no-pystemd" in sys.argv:  # its C extension does not load
    sys.modules["pystemd"] = sys.modules["pystemd.dbusexc"] = sys.modules["pystemd.dbuslib"] = None
import gpulaunch.multinode.peerlink as peerlink
import gpulaunch.start as start
import dataclasses
from gpulaunch.model import Manager, SupervisorKind

WANTED = ("gpulaunch.watcher.loop", "gpulaunch.jobapi.publisher", "gpulaunch.supervisor.direct")
assert not [m for m in WANTED if m in sys.modules], "imported before _join: the probe is moot"

class Joined(Exception):
    pass

class FakePeer:
    def join(self, wakeup):
        print(" ".join(m for m in WANTED if m in sys.modules))
        raise Joined
    def close(self):
        pass

peerlink.PeerLink.spawn = classmethod(lambda cls, cfg, draft=None: FakePeer())
@dataclasses.dataclass(frozen=True)
class Config:  # what _join reads of a NodeConfig
    nnodes: int = 2
    wanted: str = "2"
    endpoint: str = "127.0.0.1:1"
    backend: str = "static"
    membership_file: str = ""

cfg = Config()
job = types.SimpleNamespace(
    spec=types.SimpleNamespace(node_config=cfg, job="j", manager=Manager.USER),
    draft=types.SimpleNamespace(opts=types.SimpleNamespace(supervisor=SupervisorKind.DIRECT)),
)
output = types.SimpleNamespace(message=lambda text: None)
with ExitStack() as stack:
    try:
        start._join(job, output, -1, stack)
    except Joined:
        pass
"""


@pytest.mark.parametrize("pystemd", [True, False], ids=["pystemd", "no-pystemd"])
def test_the_watchers_modules_are_imported_before_the_peer_is_waited_for(pystemd: bool) -> None:
    """Without pystemd (its C extension does not load) the join goes on as before: the
    supervisor's choice says so later, and falls back to the direct supervisor."""
    argv = [sys.executable, "-c", PROBE, *([] if pystemd else ["--no-pystemd"])]
    out = subprocess.run(argv, capture_output=True, text=True, check=True, cwd=ROOT).stdout
    assert out.split() == [
        "gpulaunch.watcher.loop",
        "gpulaunch.jobapi.publisher",
        "gpulaunch.supervisor.direct",
    ]


def _lazy_imports(path: Path, function: str) -> set[str]:
    """The gpulaunch modules imported inside `function` of the module at `path`."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.FunctionDef) and node.name == function:
            for inner in ast.walk(node):
                if isinstance(inner, ast.ImportFrom) and inner.module:
                    found.update(f"{inner.module}.{a.name}" for a in inner.names)
                    found.add(inner.module)
    return {m for m in found if m.startswith("gpulaunch.") and _is_module(m)}


def _is_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:  # a.b.C where a.b is a module: C is a name in it
        return False


def test_the_join_imports_what_the_run_imports() -> None:
    """What _contain, _parts and _run import, and either supervisor they may choose: a new
    lazy import there would otherwise be back on the way from the layout to the ranks."""
    start, choose = ROOT / "gpulaunch/start.py", ROOT / "gpulaunch/supervisor/choose.py"
    joined = _lazy_imports(start, "_join")
    run = _lazy_imports(start, "_contain") | _lazy_imports(start, "_run")
    run |= _lazy_imports(start, "_parts")
    run |= _lazy_imports(choose, "_direct") | _lazy_imports(choose, "_systemd")
    run -= {"gpulaunch.supervisor.choose"}  # start.py imports it at the top
    assert len(run) >= 8
    assert run <= joined, sorted(run - joined)
