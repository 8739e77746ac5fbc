"""Signs that tell the truth: what the package's docstrings and the docs say of the code
is checked against the code, so that a sign cannot go stale unnoticed (issue 34).

- every package docstring (`gpulaunch/<package>/__init__.py`) names exactly its modules,
  each as a word `name.py` (a path such as `watcher/loop.py` is a citation, not a name);
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "gpulaunch"
PACKAGES = sorted(p.parent for p in PACKAGE.glob("*/__init__.py"))

# `loop.py`, never `watcher/loop.py` or `gpulaunch.units.codec`: a module of this package
MODULE_WORD = re.compile(r"(?<![\w/.-])([A-Za-z_]\w*)\.py\b")


def named_modules(docstring: str) -> set[str]:
    return {m.group(1) for m in MODULE_WORD.finditer(docstring)}


def test_a_module_word_is_told_from_a_path() -> None:
    text = "`loop.py` and eventloop.py, not watcher/loop.py, gpulaunch/x.py or a.b.py"
    assert named_modules(text) == {"loop", "eventloop"}


@pytest.mark.parametrize("package", PACKAGES, ids=lambda p: p.name)
def test_a_package_docstring_names_exactly_its_modules(package: Path) -> None:
    docstring = ast.get_docstring(ast.parse((package / "__init__.py").read_text())) or ""
    modules = {p.stem for p in package.glob("*.py") if p.name != "__init__.py"}
    named = named_modules(docstring)
    assert {"missing": modules - named, "gone": named - modules} == {
        "missing": set(),
        "gone": set(),
    }, f"gpulaunch/{package.name}/__init__.py: name each module as `name.py`"
