"""The shape of the package (docs/architecture.md): folders by feature, short import chains.

`python3 scripts/modmap.py` prints the map these tests measure.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("modmap", ROOT / "scripts" / "modmap.py")
assert _spec is not None and _spec.loader is not None
modmap = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(modmap)

# 10 since cli.py imports its subcommands for real (they were loaded by names in strings,
# which hid cli -> logs.command -> jobapi.commands -> ... from this count) and a rank's view
# has its module (jobapi/rankview.py). The layers are the rule (lint-imports); this a bound.
MAX_CHAIN = 10

# A module is as long as its one job needs: the line count is no rule of where code goes
# (the layers are: pyproject.toml's contract). It is a prompt to look: a module past
# LONG lines is either named below, with why its one job takes that long, or split by
# meaning. A module that grows past LONG without a reason here fails; one named here that
# no longer exists fails too (the table says what is true).
LONG = 400
LONG_BECAUSE = {
    "gpulaunch.units.codec": "systemd-run's settings table and its parser: each setting's "
    "D-Bus type next to the grammar that reads it (bus-unit-util.c, one function there)",
    "gpulaunch.units.values": "the value grammars of systemd 252's unit settings (sizes, time "
    "spans, CPU sets, quoting, specifiers, device rules): one grammar each, side by side",
    "gpulaunch.model": "the job's plan, its ranks' state and the exit-status rules: the "
    "shared vocabulary (data and pure functions) every layer above reads",
    "gpulaunch.options": "every flag of `start` and `render` (torchrun's among them) with "
    "its help text, the one place the command line's words are defined",
    "gpulaunch.cli": "every subcommand's parser and the one place errors become messages "
    "and exit codes; each command's work lives in its feature folder",
    "gpulaunch.start": "`gpulaunch start`'s phases (enter, plan, contain, run, report), "
    "each a function of its own that wires the features together",
    "gpulaunch.watcher.loop": "the watcher's one event loop: the life of a job's ranks "
    "(start gate, exits, gang stop, restarts, report) as one state machine",
    "gpulaunch.supervisor.systemd": "the systemd supervisor: the job's units made, watched "
    "and stopped through D-Bus, every race of a unit's job with its signals handled",
    "gpulaunch.supervisor.systemd_api": "the one module that talks to systemd: every call "
    "the launcher makes, its arguments built and its D-Bus errors turned into ours",
    "gpulaunch.supervisor.direct": "the direct supervisor's two ways (a cgroup per rank, "
    "else process groups) and what they share: one containment, two strengths",
    "gpulaunch.logs.output": "the terminal: every rank's lines, prefixed, the progress "
    "line and --log-dir files, read on the watcher's loop (line discipline is one job)",
    "gpulaunch.multinode.peer": "the peer process, the only one that imports torch: the "
    "rendezvous rounds, the store's failure record, the watcher's commands",
    "gpulaunch.frontend.run": "the front end's one loop: create the watcher's service, "
    "relay signals and output, exit as the watcher did",
    "gpulaunch.jobapi.commands": "every job command (list, status, stop, wait, signal) over "
    "both ways a job is found: its D-Bus object while it runs, its record after",
    "gpulaunch.jobapi.publisher": "the job's D-Bus object: its properties, methods and "
    "signals (io.gpulaunch.Job1, docs/dbus.md), served while the job runs",
}


def test_the_longest_import_chain_is_short() -> None:
    chain = modmap.longest_chain(modmap.graph())
    assert len(chain) <= MAX_CHAIN, " -> ".join(chain)


def test_a_long_module_says_why() -> None:
    sizes = {n: len(p.read_text().splitlines()) for n, p in modmap.modules().items()}
    unexplained = {n: s for n, s in sizes.items() if s > LONG and n not in LONG_BECAUSE}
    assert unexplained == {}, "split it by meaning, or say why in LONG_BECAUSE"
    assert set(LONG_BECAUSE) <= set(sizes), "LONG_BECAUSE names a module that is gone"


def test_the_flat_package_holds_only_what_the_whole_program_shares() -> None:
    top = sorted(p.name for p in (ROOT / "gpulaunch").glob("*.py"))
    assert top == [
        "__init__.py",
        "__main__.py",
        "cli.py",
        "errors.py",
        "linux.py",
        "model.py",
        "numberlist.py",
        "options.py",
        "parts.py",
        "report.py",
        "shipped.py",
        "start.py",
    ]


def loaded_by(module: str) -> set[str]:
    code = f"import sys, {module}; print('\\n'.join(sorted(sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    ).stdout
    return set(out.split())


def test_clients_load_nothing_of_the_runtime() -> None:
    """`gpulaunch status/list/wait/stop` read jobs without the watcher or pystemd."""
    for client in ("gpulaunch.jobapi.client", "gpulaunch.jobapi.commands"):
        loaded = loaded_by(client)
        runtime = {m for m in loaded if m.startswith(("gpulaunch.watcher", "gpulaunch.supervisor"))}
        assert runtime == set() and "pystemd" not in loaded, (client, runtime)
        assert "gpulaunch.jobapi.publisher" not in loaded


def test_the_read_side_does_not_know_the_watcher() -> None:
    for name, deps in modmap.graph().items():
        if name.startswith("gpulaunch.jobapi"):
            assert not any(d.startswith("gpulaunch.watcher") for d in deps), (name, deps)


def test_no_module_is_loaded_by_a_name_in_a_string() -> None:
    """The import graph (modmap, lint-imports) sees every import of the package's modules."""
    for name, path in modmap.modules().items():
        text = path.read_text()
        for line in text.splitlines():
            if "import_module(" in line or "__import__(" in line:
                # the warm process imports the user's --preload modules, none of ours
                assert '"pynvml"' in line or name == "gpulaunch.warm.rankside.server", (name, line)


def test_the_folders_form_no_cycle() -> None:
    """The layers themselves are pyproject.toml's import-linter contract (scripts/test.sh)."""
    assert modmap.cycles(modmap.folder_graph(modmap.graph())) == []


# `start()` is the checklist of a job's phases (enter, plan, contain, parts, run, report):
# a reader sees the whole flow at once, and what a phase does lives in its own function.
# One screen is the reason: 80 lines, a tall terminal, not a count to fit code under.
START_SCREEN = 80


def test_start_reads_on_one_screen() -> None:
    """start.py's `start()` conducts named phases (enter, plan, contain, run, report)."""
    import ast

    tree = ast.parse((ROOT / "gpulaunch" / "start.py").read_text())
    (func,) = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "start"]
    assert func.end_lineno is not None and func.end_lineno - func.lineno + 1 <= START_SCREEN


def _importers(package: str) -> set[str]:
    import ast

    found = set()
    for name, path in modmap.modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import) and any(
                a.name.split(".")[0] == package for a in node.names
            ):
                found.add(name)
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == package:
                found.add(name)
    return found


def test_each_dbus_client_has_its_job() -> None:
    """pystemd: the watcher's systemd calls; dbus-fast: the job API, the front end, setup."""
    assert _importers("pystemd") == {"gpulaunch.supervisor.systemd_api"}
    assert {m.split(".")[1] for m in _importers("dbus_fast")} <= {"jobapi", "frontend", "system"}
