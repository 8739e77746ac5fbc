#!/usr/bin/env python3
"""The module map of gpulaunch/: every module, its size, what it imports, the longest chain.

    python3 scripts/modmap.py            # the map, then the longest import chain
    python3 scripts/modmap.py --chain    # only the longest chain and its length
    python3 scripts/modmap.py --folders  # the folders' import graph and its cycles

The layers themselves are checked by `lint-imports` (pyproject.toml's contract).

Imports are read from the source (every `import` / `from ... import`, also those
inside functions; not those under `if TYPE_CHECKING:`, which never run), so the
numbers do not depend on what happens to be installed.
tests/unit/test_layout.py holds the limits (docs/architecture.md says why).
"""

from __future__ import annotations

import ast
import functools
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "gpulaunch"


def modules() -> dict[str, Path]:
    """Dotted module name -> file, for every module of the package."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _type_checking_only(tree: ast.Module) -> set[ast.AST]:
    """The nodes under `if TYPE_CHECKING:`: annotations, never imported at run time."""
    skipped: set[ast.AST] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test) in (
            "TYPE_CHECKING",
            "typing.TYPE_CHECKING",
        ):
            for child in node.body:
                skipped.update(ast.walk(child))
    return skipped


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The package's modules that `name` imports (a package's __init__ counts as a module)."""
    found: set[str] = set()
    tree = ast.parse(path.read_text(), str(path))
    skipped = _type_checking_only(tree)
    for node in ast.walk(tree):
        if node in skipped:
            continue
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            targets = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        for target in targets:
            if target in known and target != name:
                found.add(target)
    return found


def graph() -> dict[str, set[str]]:
    mods = modules()
    return {name: imports(name, path, set(mods)) for name, path in mods.items()}


def longest_chain(edges: dict[str, set[str]]) -> list[str]:
    """The longest path of imports (the graph has no cycles; a cycle raises RecursionError)."""

    @functools.cache
    def longest(name: str) -> tuple[str, ...]:
        best: tuple[str, ...] = ()
        for dep in sorted(edges[name]):
            chain = longest(dep)
            if len(chain) > len(best):
                best = chain
        return (name, *best)

    return list(max((longest(n) for n in sorted(edges)), key=len))


def folder(name: str) -> str:
    """A module's folder (`watcher`), or the module itself at the top (`cli`, `model`)."""
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def folder_graph(edges: dict[str, set[str]]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {folder(n): set() for n in edges}
    for name, deps in edges.items():
        out[folder(name)] |= {folder(d) for d in deps if folder(d) != folder(name)}
    return out


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one member (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for dep in sorted(edges[node]):
            if dep not in index:
                visit(dep)
                low[node] = min(low[node], low[dep])
            elif dep in stack:
                low[node] = min(low[node], index[dep])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def main(argv: list[str]) -> int:
    edges = graph()
    if "--folders" in argv:
        folders = folder_graph(edges)
        for name in sorted(folders):
            print(f"{name:12} -> {', '.join(sorted(folders[name]))}")
        found = cycles(folders)
        print(f"folder cycles: {len(found)}, members: {sum(len(c) for c in found)}")
        for c in found:
            print("  " + " ".join(c))
        return 0
    chain = longest_chain(edges)
    if "--chain" not in argv:
        mods = modules()
        for name in sorted(mods):
            lines = len(mods[name].read_text().splitlines())
            deps = ", ".join(sorted(d.removeprefix("gpulaunch.") for d in edges[name]))
            print(f"{name:40} {lines:4}  {deps}")
        print()
    print(f"longest import chain: {len(chain)} modules")
    print("  " + " -> ".join(chain))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
