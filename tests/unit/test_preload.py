"""A multi-node watcher imports what runs the job while its peer joins the other nodes
(start.py `_join`; issue 27's start profile, bench/nodestart.py)."""

from __future__ import annotations

import ast
import importlib.util
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# In a fresh interpreter: start._join with a peer that notes, when it is asked to join,
# which of the watcher's modules are already imported (then stops the join).
PROBE = """
import sys, types
from contextlib import ExitStack
import gpulaunch.multinode.peerlink as peerlink
import gpulaunch.start as start
from gpulaunch.model import SupervisorKind

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

peerlink.PeerLink.spawn = classmethod(lambda cls, cfg: FakePeer())
cfg = types.SimpleNamespace(nnodes=2, endpoint="127.0.0.1:1", backend="static")
job = types.SimpleNamespace(
    spec=types.SimpleNamespace(node_config=cfg, job="j"),
    draft=types.SimpleNamespace(opts=types.SimpleNamespace(supervisor=SupervisorKind.DIRECT)),
)
output = types.SimpleNamespace(message=lambda text: None)
with ExitStack() as stack:
    try:
        start._join(job, output, -1, stack)
    except Joined:
        pass
"""


def test_the_watchers_modules_are_imported_before_the_peer_is_waited_for() -> None:
    out = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, check=True, cwd=ROOT
    ).stdout.split()
    assert out == [
        "gpulaunch.watcher.loop",
        "gpulaunch.jobapi.publisher",
        "gpulaunch.supervisor.direct",
    ]


def _lazy_imports(path: Path, function: str, branch: str = "") -> set[str]:
    """The gpulaunch modules imported inside `function` of the module at `path` (`branch`:
    only in the body of the if/else whose test mentions it, "else" for its else)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.FunctionDef) and node.name == function:
            scope: list[ast.AST] = [node]
            if branch:
                ifs = [n for n in ast.walk(node) if isinstance(n, ast.If)]
                chosen = [n for n in ifs if "direct_likely" in ast.unparse(n.test)]
                scope = list(chosen[0].orelse if branch == "else" else chosen[0].body)
            for top in scope:
                for inner in ast.walk(top):
                    if isinstance(inner, ast.ImportFrom) and inner.module:
                        found.update(f"{inner.module}.{a.name}" for a in inner.names)
                        found.add(inner.module)
    return {m for m in found if m.startswith("gpulaunch.")}


def _modules(names: set[str]) -> set[str]:
    """The names that are modules (`from a.b import c`: a.b, and c where c is a module)."""
    return {n for n in names if _is_module(n)}


def _is_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:  # a.b.C where a.b is a module: C is a name in it
        return False


def test_the_join_imports_what_the_run_imports() -> None:
    """What _contain and _run import, and the supervisor they choose: a new lazy import
    there would otherwise be back on the way from the layout to the ranks."""
    start, choose = ROOT / "gpulaunch/start.py", ROOT / "gpulaunch/supervisor/choose.py"
    joined = _modules(_lazy_imports(start, "_join"))
    run = _modules(_lazy_imports(start, "_contain") | _lazy_imports(start, "_run"))
    direct = _modules(_lazy_imports(choose, "_direct"))
    systemd = _modules(_lazy_imports(choose, "_systemd"))
    assert run and direct and systemd
    assert run - {"gpulaunch.supervisor.choose"} <= joined, sorted(run - joined)
    assert direct <= _modules(_lazy_imports(start, "_join", "if")), sorted(direct)
    assert systemd <= _modules(_lazy_imports(start, "_join", "else")), sorted(systemd)
